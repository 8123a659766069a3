"""`algorithm.adv_estimator=gym_bridge_grpo`: verl's GRPO advantage with masked samples out of the groups.

verl's GRPO takes group statistics over all samples, so a rollout `GymBridgeAgentLoop` masked (all-zero
`response_mask`, reward 0.0) still pulls its group's baseline; here groups count only samples with a
trainable token, and masked ones get advantage 0. verl registers it when it loads its plugins.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from verl.trainer.ppo.core_algos import register_adv_est

NAME = "gym_bridge_grpo"


def compute_gym_bridge_grpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), each `(batch, response_length)`: the sample's outcome reward minus its
    group's mean over trainable samples, divided by that std (unless `norm_adv_by_std_in_grpo` is off,
    from the argument or `algorithm.norm_adv_by_std_in_grpo`), on its trainable tokens; a group of one
    trainable sample gets mean 0 and std 1, as in verl's GRPO."""
    if norm_adv_by_std_in_grpo is None:
        norm_adv_by_std_in_grpo = bool(config.get("norm_adv_by_std_in_grpo", True)) if config is not None else True
    scores = token_level_rewards.sum(dim=-1)
    trainable = response_mask.sum(dim=-1) > 0
    advantages = torch.zeros_like(scores)
    with torch.no_grad():
        groups: dict[Any, list[int]] = defaultdict(list)
        for row in range(scores.shape[0]):
            if trainable[row]:
                groups[index[row]].append(row)
        for rows in groups.values():
            values = scores[rows]
            mean, std = (values.mean(), values.std()) if len(rows) > 1 else (torch.tensor(0.0), torch.tensor(1.0))
            centered = values - mean
            advantages[rows] = centered / (std + epsilon) if norm_adv_by_std_in_grpo else centered
        advantages = advantages.unsqueeze(-1) * response_mask
    return advantages, advantages


# called, not used as a decorator: verl types register_adv_est as returning Any, which would make the function untyped
register_adv_est(NAME)(compute_gym_bridge_grpo_advantage)
