"""Records -> training rows for the async worker: each scored rollout's token rows and its group advantage.

A group's advantage is TRL's `(reward - mean) / (std + 1e-8)` over the scored rollouts only (a failed or masked
rollout is out of the mean and the deviation). It is computed on rewards scaled by their largest magnitude, so
finite rewards anywhere in a float's range (1e308 beside 0) give finite advantages instead of an overflowed mean
and NaN. A harness rollout whose history was rewritten gives one row per token segment.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gym_bridge.core.record import RolloutRecord
from gym_bridge.core.training_row import to_training_row
from gym_bridge.core.trajectory import final_text

__all__ = ["GroupAdvantages", "TrainingSegment", "group_advantages", "last_text", "training_segments"]

ADVANTAGE_EPSILON = 1e-8
"""Added to the group's reward deviation, as TRL does, so a group of equal rewards gets advantages of 0."""


@dataclass(frozen=True)
class TrainingSegment:
    """One training row of a rollout: the whole token sequence, what is trained, the sampled log-probs."""

    input_ids: list[int]
    completion_mask: list[int]
    old_log_probs: list[float]


@dataclass(frozen=True)
class GroupAdvantages:
    """A group's advantages by rollout position (scored rollouts only), with its reward mean and deviation."""

    by_position: dict[int, float]
    mean: float
    """NaN when no rollout of the group was scored."""
    std: float
    """The population deviation; NaN when no rollout was scored."""


def training_segments(record: RolloutRecord, *, eos_token_ids: Sequence[int], max_completion_length: int) -> list[TrainingSegment]:
    """The rows of a scored rollout: its token segments when a harness rewrote its history, else its one
    token stream under the shared rules of `core.training_row` (an answer without EOS gets one, untrained)."""
    views = record.tokens.segments
    if views:
        return [TrainingSegment(input_ids=[*view.prompt_ids, *view.completion_ids],
                                completion_mask=[0] * len(view.prompt_ids) + list(view.completion_mask),
                                old_log_probs=[0.0] * len(view.prompt_ids) + [float(value) for value in view.completion_logprobs])
                for view in views if any(view.completion_mask)]
    row = to_training_row(record, max_completion_length=max_completion_length, eos_token_ids=eos_token_ids)
    return [TrainingSegment(input_ids=[*row.prompt_ids, *row.completion_ids], completion_mask=[0] * len(row.prompt_ids) + list(row.completion_mask),
                            old_log_probs=[0.0] * len(row.prompt_ids) + list(row.completion_logprobs))]


def group_advantages(records: Sequence[RolloutRecord]) -> GroupAdvantages:
    """Advantages of the scored rollouts of one group (see the module docstring): finite for any finite rewards."""
    scored = {position: float(record.reward) for position, record in enumerate(records) if not record.mask_sample}
    if not scored:
        return GroupAdvantages({}, math.nan, math.nan)
    scale = max(abs(reward) for reward in scored.values()) or 1.0
    scaled = {position: reward / scale for position, reward in scored.items()}  # each in [-1, 1]: no sum overflows
    mean = sum(scaled.values()) / len(scaled)
    std = math.sqrt(sum((value - mean) ** 2 for value in scaled.values()) / len(scaled))
    advantages = {position: (value - mean) / (std + ADVANTAGE_EPSILON / scale) for position, value in scaled.items()}
    return GroupAdvantages(advantages, mean * scale, std * scale)


def last_text(record: RolloutRecord) -> str:
    """The text of the rollout's last assistant message ('' when it ended without one)."""
    return final_text(record.output)
