"""Records -> training rows for the async worker: each scored rollout's token rows and its group advantage.

A group's advantage is TRL's `(reward - mean) / (std + 1e-8)` over the scored rollouts only (a failed or masked
rollout is out of the mean and the deviation). It is computed on rewards scaled by their largest magnitude, so
finite rewards anywhere in a float's range (1e308 beside 0) give finite advantages instead of an overflowed mean
and NaN. A harness rollout whose history was rewritten gives one row per token segment. `RowMaker` turns a finished
group into TRL's `RolloutSample`s with their metrics.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gym_bridge.core.environment import Environment
from gym_bridge.core.record import RolloutRecord
from gym_bridge.core.training_row import to_training_row
from gym_bridge.core.trajectory import final_text

__all__ = ["GroupAdvantages", "GroupRows", "Row", "RowMaker", "TrainingSegment", "group_advantages", "training_segments"]

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


@dataclass(frozen=True)
class Row:
    """One training row for the trainer, with the rollout it came from (its record is written when the row is taken)."""

    sample: Any
    """TRL's `RolloutSample`."""
    record: RolloutRecord
    first: bool
    """Whether it is the rollout's first row (the one whose taking writes the record)."""


@dataclass(frozen=True)
class GroupRows:
    """A finished group's rows, the records of its rollouts left out of the loss, and the group's metrics."""

    rows: list[Row]
    left_out: list[RolloutRecord]
    metrics: dict[str, Any]


class RowMaker:
    """A finished group's records -> TRL's `RolloutSample`s: one per token segment of each scored rollout, with the
    group's advantage and the version `row_version(group, repeat, record)` gives; counts into `counts`."""

    def __init__(self, sample_class: Any, *, eos_token_ids: Sequence[int], max_completion_length: int,
                 row_version: Callable[[int, int, RolloutRecord], int], counts: Counter[str]) -> None:
        self.sample_class = sample_class
        self.eos_token_ids = tuple(eos_token_ids)
        self.max_completion_length = max_completion_length
        self.row_version = row_version
        self.counts = counts

    def group(self, group_id: int, records: list[RolloutRecord], env_class: type[Environment]) -> GroupRows:
        advantages = group_advantages(records)
        rows: list[Row] = []
        left_out: list[RolloutRecord] = []
        for position, record in enumerate(records):
            self.counts["rollouts"] += 1
            if position not in advantages.by_position:
                self.counts["failed"] += 1
                self.counts[f"failed/{record.failure_kind or 'masked'}"] += 1
                left_out.append(record)
                continue
            rows += self._rollout_rows(group_id, position, record, advantages, env_class)
        self.counts["groups"] += 1
        self.counts["rows"] += len(rows)
        return GroupRows(rows, left_out, group_metrics(records, env_class, advantages.mean, len(rows)))

    def _rollout_rows(self, group_id: int, position: int, record: RolloutRecord, advantages: GroupAdvantages,
                      env_class: type[Environment]) -> list[Row]:
        version = self.row_version(group_id, position, record)
        oldest = min(record.policy_versions, default=version)
        metrics = {"reward": float(record.reward), "reward_std": advantages.std, f"rewards/{env_class.name}": float(record.reward),
                   "gym_bridge/turns": float(record.turns), "gym_bridge/tool_calls": float(record.tool_calls),
                   "gym_bridge/row_version_span": float(max(version - oldest, 0))}
        segments = training_segments(record, eos_token_ids=self.eos_token_ids, max_completion_length=self.max_completion_length)
        return [Row(self._sample(record, segment, advantages.by_position[position], version, group_id, metrics), record, index == 0)
                for index, segment in enumerate(segments)]

    def _sample(self, record: RolloutRecord, segment: TrainingSegment, advantage: float, version: int, group_id: int,
                metrics: Mapping[str, float]) -> Any:
        import numpy as np

        return self.sample_class(
            prompt=[dict(message) for message in record.task.messages],
            completion=[{"role": "assistant", "content": final_text(record.output)}],
            input_ids=np.asarray(segment.input_ids, dtype=np.int64),
            completion_mask=np.asarray(segment.completion_mask, dtype=np.int64),
            old_log_probs=np.asarray(segment.old_log_probs, dtype=np.float32),
            advantage=float(advantage), model_version=int(version), group_id=int(group_id), metrics=dict(metrics),
        )


def group_metrics(records: Sequence[RolloutRecord], env_class: type[Environment], mean: float, rows: int) -> dict[str, Any]:
    """A group's totals and rates for the trainer's log (a pair is a ratio the trainer sums across groups)."""
    name = env_class.name
    failed = [record for record in records if record.mask_sample]
    values: dict[str, Any] = {
        "gym_bridge/rollouts_total": float(len(records)),
        "gym_bridge/failed_total": float(len(failed)),
        "gym_bridge/rows_total": float(rows),
        f"gym_bridge/failed_rate/{name}": (float(len(failed)), float(len(records))),
        "gym_bridge/tool_calls_per_rollout": (float(sum(record.tool_calls for record in records)), float(len(records))),
        "gym_bridge/parse_errors_total": float(sum(record.parse_errors for record in records)),
        "gym_bridge/unparsed_tool_calls_total": float(sum(record.unparsed_tool_calls for record in records)),
        f"gym_bridge/rollouts_with_tool_call/{name}": (float(sum(record.tool_calls > 0 for record in records)), float(len(records))),
    }
    if not math.isnan(mean):
        values[f"gym_bridge/reward/{name}"] = mean
    for kind, count in Counter(record.failure_kind or "masked" for record in failed).items():
        values[f"gym_bridge/failures/{kind}_total"] = float(count)
    return values
