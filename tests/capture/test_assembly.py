"""Segment assembly on token ids: merges, rewrites, masks and log-probs."""

from __future__ import annotations

import pytest

from gym_bridge.capture.assembly import CapturedCall, assemble


def call(prompt: list[int], completion: list[int]) -> CapturedCall:
    return CapturedCall(prompt_ids=prompt, completion_ids=completion, logprobs=[-float(t) / 10 for t in completion])


def test_extending_calls_merge_into_one_segment_with_env_tokens_masked() -> None:
    # call 1: prompt [1 2 3] -> [4 5]; call 2: prompt [1 2 3 4 5 6 7] (6 7 = tool output) -> [8]
    assembly = assemble([call([1, 2, 3], [4, 5]), call([1, 2, 3, 4, 5, 6, 7], [8])])
    assert assembly.rewrites == 0 and assembly.calls_per_segment == (2,)
    (segment,) = assembly.segments
    assert segment.prompt_ids == [1, 2, 3]
    assert segment.completion_ids == [4, 5, 6, 7, 8]
    assert segment.completion_mask == [1, 1, 0, 0, 1]
    assert segment.completion_logprobs == [-0.4, -0.5, 0.0, 0.0, -0.8]


def test_a_rewritten_history_starts_a_new_segment_and_keeps_the_old_one() -> None:
    # call 2 drops the sampled 5 (edited history): [1 2 3 4 9] does not start with [1 2 3 4 5]
    calls = [call([1, 2, 3], [4, 5]), call([1, 2, 3, 4, 9], [6]), call([1, 2, 3, 4, 9, 6, 7], [8])]
    assembly = assemble(calls)
    assert assembly.rewrites == 1 and assembly.calls_per_segment == (1, 2)
    first, second = assembly.segments
    assert (first.prompt_ids, first.completion_ids, first.completion_mask) == ([1, 2, 3], [4, 5], [1, 1])
    assert second.prompt_ids == [1, 2, 3, 4, 9]  # the rewritten prompt is kept as given, never re-tokenized
    assert second.completion_ids == [6, 7, 8] and second.completion_mask == [1, 0, 1]
    assert assembly.last is second


def test_a_shorter_prompt_is_a_rewrite_even_when_it_is_a_prefix() -> None:
    # compaction: call 2's prompt [1 2] is shorter than what came before [1 2 3 4]
    assembly = assemble([call([1, 2, 3], [4]), call([1, 2], [5])])
    assert assembly.rewrites == 1
    assert [s.prompt_ids for s in assembly.segments] == [[1, 2, 3], [1, 2]]


def test_a_prompt_exactly_equal_to_the_segment_adds_no_env_tokens() -> None:
    assembly = assemble([call([1], [2, 3]), call([1, 2, 3], [4])])
    assert assembly.segments[0].completion_mask == [1, 1, 1]


def test_no_calls_no_segments_and_mismatched_logprobs_are_refused() -> None:
    assert assemble([]).segments == () and assemble([]).rewrites == 0 and assemble([]).last is None
    with pytest.raises(ValueError, match="call 1 has 2 completion ids but 1 log-probs"):
        assemble([CapturedCall(prompt_ids=[1], completion_ids=[2, 3], logprobs=[0.0])])
