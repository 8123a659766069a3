"""Token-exact assembly of captured model calls into training segments.

A harness calls the model many times; each call has the prompt ids it was given and the ids it
sampled (with log-probs). Consecutive calls merge into one segment while a call's prompt starts
with the segment so far (earlier prompt + everything sampled since), checked on token ids: the
new prompt tokens are environment tokens (masked), the sampled ones are model tokens (trained).
A call whose prompt does not extend the segment (the harness compacted, dropped reasoning or
edited a message) starts a new segment instead of re-tokenizing; every segment is kept and the
number of such rewrites is reported. Pure and trainer-free: lists of ints in, segments out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gym_bridge.core.trajectory import TokenView, extends


@dataclass(frozen=True)
class CapturedCall:
    """One model call as the capture endpoint served it."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    """One log-prob per completion id."""


@dataclass(frozen=True)
class Assembly:
    """The segments of one rollout, in call order."""

    segments: tuple[TokenView, ...]
    calls_per_segment: tuple[int, ...]

    @property
    def rewrites(self) -> int:
        """How many times the harness rewrote its history (a call that started a new segment)."""
        return max(len(self.segments) - 1, 0)

    @property
    def last(self) -> TokenView | None:
        return self.segments[-1] if self.segments else None


def assemble(calls: Sequence[CapturedCall]) -> Assembly:
    """Merge `calls` into segments; raises ValueError when a call's ids and log-probs differ in length."""
    segments: list[TokenView] = []
    counts: list[int] = []
    for number, call in enumerate(calls, start=1):
        if len(call.completion_ids) != len(call.logprobs):
            raise ValueError(f"call {number} has {len(call.completion_ids)} completion ids but {len(call.logprobs)} log-probs")
        current = segments[-1] if segments else None
        if current is not None and extends(current.prompt_ids + current.completion_ids, call.prompt_ids):
            segments[-1] = _grown(current, call)
            counts[-1] += 1
        else:
            segments.append(TokenView(prompt_ids=list(call.prompt_ids), completion_ids=list(call.completion_ids),
                                      completion_mask=[1] * len(call.completion_ids), completion_logprobs=list(call.logprobs)))
            counts.append(1)
    return Assembly(segments=tuple(segments), calls_per_segment=tuple(counts))


def _grown(segment: TokenView, call: CapturedCall) -> TokenView:
    """`segment` followed by the call's new prompt tokens (masked) and its sampled tokens (trained)."""
    new_env = list(call.prompt_ids[len(segment.prompt_ids) + len(segment.completion_ids):])
    return TokenView(
        prompt_ids=segment.prompt_ids,
        completion_ids=segment.completion_ids + new_env + list(call.completion_ids),
        completion_mask=segment.completion_mask + [0] * len(new_env) + [1] * len(call.completion_ids),
        completion_logprobs=segment.completion_logprobs + [0.0] * len(new_env) + list(call.logprobs),
    )
