"""The async worker's rollout buffer (gym_bridge.trl._async.buffer): TRL's trainer takes rows with `get`, and each take
tells the worker the group taken, the row's staleness, and writes the rollout's record once with the version it was
taken at; the records of rollouts left out of the loss are written when their group is pushed."""

from __future__ import annotations

import json
import queue
from types import SimpleNamespace

import pytest

from gym_bridge.core.record import RolloutRecord
from gym_bridge.core.task import parse_task
from gym_bridge.core.trajectory import TokenView
from gym_bridge.trl._async.buffer import RolloutBuffer
from gym_bridge.trl._async.rows import Row


def record(reward: float, *, failed: bool = False) -> RolloutRecord:
    task = parse_task({"prompt": "2 + 2?", "environment": "arithmetic", "answer": "4"}, index=0)
    tokens = TokenView(prompt_ids=[1], completion_ids=[2], completion_mask=[1], completion_logprobs=[-0.1])
    return RolloutRecord(task=task, repeat_index=0, env="arithmetic", output=[], tokens=tokens, reward=reward, reward_components={},
                         mask_sample=failed, failure_kind="env" if failed else None, failure_reason=None, finish_reason="answer",
                         turns=1, tool_calls=0, latency_s=0.0, policy_versions=(3,))


def sample(group_id: int, version: int, span: float = 0.0) -> SimpleNamespace:
    return SimpleNamespace(model_version=version, group_id=group_id, metrics={"gym_bridge/row_version_span": span})


def test_a_take_reports_its_group_and_staleness_and_writes_the_record_once(tmp_path):
    version, taken, metrics = {"now": 5}, [], queue.Queue()
    buffer = RolloutBuffer(version=lambda: version["now"], taken=taken.append, metrics=metrics, records_path=str(tmp_path / "r.jsonl"))
    kept = record(1.0)
    # a rollout with two rows (two token segments): only its first row's take writes the record
    buffer.push([Row(sample(7, 4, span=1.0), kept, True), Row(sample(7, 4, span=1.0), kept, False)], left_out=[record(0.0, failed=True)])
    lines = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [line["failure_kind"] for line in lines] == ["env"]  # the left-out rollout, at push; nothing taken yet
    assert buffer.qsize() == 2 and not buffer.empty()
    first = buffer.get(timeout=1)
    version["now"] = 6
    second = buffer.get_nowait()
    assert (first.group_id, second.group_id) == (7, 7) and taken == [7, 7] and buffer.empty()
    reported = [metrics.get_nowait() for _ in range(2)]
    # taken at 5 and 6 a row of version 4 whose first call was one version older: staleness 1 and 2, oldest token 2 and 3
    assert [m["gym_bridge/staleness_max"] for m in reported] == [1.0, 2.0]
    assert [m["gym_bridge/oldest_token_staleness_max"] for m in reported] == [2.0, 3.0]
    lines = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and lines[1]["metrics"]["consumed_version"] == 5  # written once, at the first row's take
    with pytest.raises(queue.Empty):
        buffer.get(timeout=0.01)
    buffer.close()
    buffer.push([Row(sample(8, 6), record(1.0), True)])
    buffer.get_nowait()  # taken after close: reported, not written
    assert taken == [7, 7, 8] and len((tmp_path / "r.jsonl").read_text().splitlines()) == 2
