"""The one place gym_bridge imports TRL's async GRPO seams (`trl.experimental.async_grpo` in TRL 1.16).

TRL 1.18 moves these names; when it lands, this module is the only one to change. Everything here is
imported on first use, so importing gym_bridge's TRL adapter never imports TRL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gym_bridge.core.errors import MissingExtraError

INSTALL_HINT = "pip install 'trl>=1.16' (AsyncGRPOTrainer is trl.experimental.async_grpo)"


@dataclass(frozen=True)
class AsyncSeams:
    """TRL's async GRPO classes that gym_bridge plugs into."""

    trainer: Any
    """`AsyncGRPOTrainer`."""
    config: Any
    """`AsyncGRPOConfig`."""
    rollout_sample: Any
    """`RolloutSample`: one training row as the trainer's queue takes it."""


def async_seams() -> AsyncSeams:
    """TRL's async GRPO classes; raises MissingDependencyError with the install hint when TRL lacks them."""
    try:
        from trl.experimental.async_grpo.async_grpo_config import AsyncGRPOConfig
        from trl.experimental.async_grpo.async_grpo_trainer import AsyncGRPOTrainer
        from trl.experimental.async_grpo.async_rollout_worker import RolloutSample
    except ImportError as error:
        raise MissingExtraError(f"TRL's async GRPO trainer is not importable ({error}); {INSTALL_HINT}") from error
    return AsyncSeams(trainer=AsyncGRPOTrainer, config=AsyncGRPOConfig, rollout_sample=RolloutSample)


def tree_attention_name() -> str:
    """The attention implementation name AsyncGRPOTrainer loads its model with (its packed tree attention)."""
    try:
        from trl.experimental.async_grpo.packing import TREE_ATTENTION
    except ImportError as error:
        raise MissingExtraError(f"TRL's async GRPO trainer is not importable ({error}); {INSTALL_HINT}") from error
    return str(TREE_ATTENTION)
