"""`gym_bridge.trl`: the TRL adapter under its public name (`from gym_bridge.trl import rollout`).

Importing this module imports nothing but itself: each name resolves on first use from
`gym_bridge.adapters.trl`, which loads gym_bridge's core (no torch, no trl) when imported; torch,
transformers and trl are imported when a rollout first runs against a trainer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gym_bridge._lazy import lazy_names

if TYPE_CHECKING:  # the names, for type checkers and linters; at run time `__getattr__` imports them
    from gym_bridge.adapters.trl import (  # noqa: F401
        AsyncRolloutWorker, AsyncWorkerSettings, RolloutOptions, TRLRollout, env_reward, example_data_paths, load_dataset, make_rollout,
        reward_metrics, rollout, to_trl_batch,
    )

__all__ = [
    "AsyncRolloutWorker", "AsyncWorkerSettings", "RolloutOptions", "TRLRollout", "env_reward", "example_data_paths", "load_dataset", "make_rollout",
    "reward_metrics", "rollout", "to_trl_batch",
]
_ADAPTER = "gym_bridge.adapters.trl"

__getattr__, __dir__ = lazy_names(globals(), _ADAPTER, __all__)
