"""The NeMo Gym dialect (`core/dialects/nemo_gym.py`, issue 37 item 7): a record as `/run` answers it, keeping the
token ids of a harness's last segment only, split by the capture assembly's own rule; and the `/run` row's id."""

from __future__ import annotations

import random

import pytest

from gym_bridge.capture.assembly import CapturedCall, assemble
from gym_bridge.core.dialects.nemo_gym import _calls_in_last_segment, rollout_id, to_run_result
from gym_bridge.core.errors import DataError
from gym_bridge.core.items import TOKEN_FIELDS
from gym_bridge.core.record import RolloutRecord
from gym_bridge.core.task import parse_task
from gym_bridge.core.trajectory import TokenView


def call_item(prompt: list[int], completion: list[int]) -> dict[str, object]:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "x"}],
            "prompt_token_ids": prompt, "generation_token_ids": completion, "generation_log_probs": [-0.1] * len(completion)}


def harness_calls(rng: random.Random, count: int) -> list[tuple[list[int], list[int]]]:
    """`count` calls of a harness that continues its history, and now and then rewrites it (a new prompt)."""
    calls: list[tuple[list[int], list[int]]] = []
    for _ in range(count):
        if calls and rng.random() < 0.7:
            prompt, completion = calls[-1]
            next_prompt = prompt + completion + [rng.randrange(50, 60) for _ in range(rng.randrange(0, 3))]
        else:
            next_prompt = [rng.randrange(1, 5) for _ in range(rng.randrange(1, 4))]
        calls.append((next_prompt, [rng.randrange(10, 20) for _ in range(rng.randrange(0, 3))]))
    return calls


@pytest.mark.parametrize("seed", range(200))
def test_the_last_segment_is_the_one_the_capture_assembly_finds(seed: int) -> None:
    calls = harness_calls(random.Random(seed), random.Random(seed).randrange(1, 8))
    assembled = assemble([CapturedCall(prompt_ids=p, completion_ids=c, logprobs=[-0.1] * len(c)) for p, c in calls])
    assert _calls_in_last_segment([call_item(p, c) for p, c in calls]) == assembled.calls_per_segment[-1]


def test_a_run_result_keeps_the_last_segments_token_ids_and_names_failures_as_nemo_gym_does() -> None:
    calls = [([1], [10]), ([1, 10, 50], [11]), ([2], [12]), ([2, 12], [13])]  # the harness rewrote once: two segments of two
    last = TokenView(prompt_ids=[2], completion_ids=[12, 13], completion_mask=[1, 1], completion_logprobs=[-0.1, -0.1])
    first = TokenView(prompt_ids=[1], completion_ids=[10, 50, 11], completion_mask=[1, 0, 1], completion_logprobs=[-0.1, 0.0, -0.1])
    record = RolloutRecord(
        task=parse_task({"prompt": "hi", "environment": "math", "expected_answer": "4", "instance_config": {"a": 1}}, index=0),
        repeat_index=0, env="math", output=[call_item(p, c) for p, c in calls],
        tokens=TokenView(prompt_ids=[2], completion_ids=[12, 13], completion_mask=[1, 1], completion_logprobs=[-0.1, -0.1],
                         segments=(first, last)),
        reward=0.0, reward_components={}, mask_sample=True, failure_kind="timeout", failure_reason="late",
        finish_reason="failed", turns=4, tool_calls=0, latency_s=1.0)
    result = to_run_result(record)
    carrying = [item for item in result["response"]["output"] if any(key in item for key in TOKEN_FIELDS)]
    assert [item["generation_token_ids"] for item in carrying] == [[12], [13]]
    assert "tokens" not in result and result["failure_kind"] == "agent_timeout"
    assert result["instance_config"] == {"a": 1, "mask_sample": True}
    assert record.output[0]["generation_token_ids"] == [10]  # the record's own items are left as they are


def test_a_rows_rollout_id_is_both_halves_or_none() -> None:
    assert rollout_id({"_ng_task_index": 3, "_ng_rollout_index": 0}) == (3, 0)
    assert rollout_id({"prompt": "x"}) is None and rollout_id([1, 2]) is None
    with pytest.raises(DataError) as half:
        rollout_id({"_ng_task_index": 3})
    assert half.value.field == "_ng_rollout_index"
