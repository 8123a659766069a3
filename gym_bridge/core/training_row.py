"""The trainer-neutral training row: what every trainer adapter gets from one rollout record.

The rules every trainer shares live here, once: a masked rollout (a failure, or a sample its
verifier masked) keeps its tokens with the completion mask all 0 and reward None, so it leaves
both the loss and the group baseline; an empty completion becomes one EOS id with mask 0 (no
trainer takes an empty row); an episode that ended with an answer but no EOS id gets one appended
(mask 0) while the completion budget allows. A harness that rewrote its history left several token
segments: the row is its last segment (the flat `tokens`, never re-tokenized) and `harness_rewrites`
counts the earlier segments, left untrained. Adapters only rename and reshape these fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gym_bridge.core.record import RolloutFinish, RolloutRecord

__all__ = ["TrainingRow", "to_training_row"]


@dataclass(frozen=True)
class TrainingRow:
    """One rollout as a trainer trains on it."""

    prompt_ids: tuple[int, ...]
    """Prompt token ids (one EOS id when the record has none)."""
    completion_ids: tuple[int, ...]
    """Model and environment tokens after the prompt, never empty."""
    completion_mask: tuple[int, ...]
    """1 on sampled tokens, 0 on environment tokens, padding and every token of a masked row."""
    completion_logprobs: tuple[float, ...]
    """Log-prob of each completion token under the sampling policy (0.0 off the model's tokens)."""
    reward: float | None
    """The verifier's reward; None when the row is masked."""
    reward_components: dict[str, float]
    """Named parts of the reward; empty when the row is masked."""
    masked: bool
    """Out of the loss and the group baseline (a failure, or a sample the verifier masked)."""
    failure_kind: str | None
    """Why the rollout failed (see `core.errors.FAILURE_KINDS`); None when it did not."""
    env_name: str
    turns: int
    tool_calls: int
    finish_reason: RolloutFinish
    parse_errors: int
    unparsed_tool_calls: int
    harness_rewrites: int
    """History rewrites of a harness: its token segments before the last, which are not trained."""


def to_training_row(record: RolloutRecord, *, max_completion_length: int, eos_token_ids: Sequence[int]) -> TrainingRow:
    """`record` as a training row, under the shared rules of the module docstring.

    `eos_token_ids[0]` is the id appended (the template's end-of-turn id first, as adapters pass it);
    any of them counts as an EOS already there. Raises ValueError for an empty `eos_token_ids`.
    """
    if not eos_token_ids:
        raise ValueError("to_training_row needs at least one EOS token id")
    eos = eos_token_ids[0]
    tokens = record.tokens
    masked = record.mask_sample
    completion_ids = list(tokens.completion_ids)
    mask = [0] * len(completion_ids) if masked else list(tokens.completion_mask)
    logprobs = [float(value) for value in tokens.completion_logprobs]
    if not completion_ids:
        completion_ids, mask, logprobs = [eos], [0], [0.0]
    elif record.finish_reason == "answer" and completion_ids[-1] not in eos_token_ids and len(completion_ids) < max_completion_length:
        completion_ids.append(eos)
        mask.append(0)
        logprobs.append(0.0)
    return TrainingRow(
        prompt_ids=tuple(tokens.prompt_ids) or (eos,),
        completion_ids=tuple(completion_ids),
        completion_mask=tuple(mask),
        completion_logprobs=tuple(logprobs),
        reward=None if masked else float(record.reward),
        reward_components={} if masked else dict(record.reward_components),
        masked=masked,
        failure_kind=record.failure_kind,
        env_name=record.env,
        turns=record.turns,
        tool_calls=record.tool_calls,
        finish_reason=record.finish_reason,
        parse_errors=record.parse_errors,
        unparsed_tool_calls=record.unparsed_tool_calls,
        harness_rewrites=max(len(tokens.segments) - 1, 0),
    )
