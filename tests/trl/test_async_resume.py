"""The TRL async worker across a trainer restart: a worker stopped with its groups mid-episode (the trainer's process
going down; here in process: its loop is cancelled after the commits of finished turns) and a new worker started over
the same journal continue those groups from their last turn, token for token as an uninterrupted run, each earlier
turn keeping the policy version it was generated with, so the trainer can judge the rows' staleness."""

from __future__ import annotations

import asyncio
import json
import queue
import time

import pytest

pytest.importorskip("trl.experimental.async_grpo", reason="needs TRL >= 1.16")

from gym_bridge.trl._async.settings import AsyncWorkerSettings  # noqa: E402
from gym_bridge.trl._async.worker import AsyncRolloutWorker  # noqa: E402
from gym_bridge.core.agent_loop import Limits  # noqa: E402
from gym_bridge.core.task import load_tasks, parse_task  # noqa: E402
from tests.support.resume_kit import TurnPolicy  # noqa: E402
from tests.support.scripted_model import finished_turns

ROOT = __import__("pathlib").Path(__file__).parents[2]
TEXTS = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
         '<tool_call>\n{"name": "get_weather", "arguments": {"city": "London"}}\n</tool_call>',
         '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>',
         "Cold, cold and mild.")


class StuckAt(TurnPolicy):
    """A TurnPolicy whose calls from number `stuck_at` on never return (the trainer dies while they run)."""

    def __init__(self, *args, stuck_at: int, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.stuck_at = stuck_at

    async def generate(self, request):  # type: ignore[no-untyped-def]
        if self.calls + 1 >= self.stuck_at:
            self.calls += 1
            await asyncio.Event().wait()
        return await super().generate(request)


def worker(policy, template, tmp_path, name: str, journal: bool = True) -> AsyncRolloutWorker:  # type: ignore[no-untyped-def]
    weather = [parse_task(load_tasks(ROOT / "environments/weather/data/example.jsonl", limit=1)[0].row, index=0)]
    settings = AsyncWorkerSettings(group_size=2, max_staleness=0, rows_per_version=2, limits=Limits(max_turns=6, max_completion_tokens=2048),
                                   records_path=str(tmp_path / f"{name}.jsonl"), journal_dir=str(tmp_path / "journal") if journal else None,
                                   row_budget=2)  # the trainer takes group 0's two rows in all: once the buffer is empty,
    # no second group may start (it would be in flight at stop, its journal kept: the test's end would depend on timing)
    return AsyncRolloutWorker(weather, policy, template, settings)


def take(worker: AsyncRolloutWorker, count: int) -> list:  # type: ignore[type-arg]
    samples, deadline = [], time.monotonic() + 60
    while len(samples) < count:
        assert time.monotonic() < deadline
        worker.check_health(30)
        try:
            samples.append(worker.rollout_buffer.get(timeout=0.2))
        except queue.Empty:
            pass
    return samples


def test_a_restarted_worker_continues_the_groups_in_flight_keeping_their_turns_policy_versions(smol_template, smol_tokenizer, tmp_path):
    turns = finished_turns(smol_tokenizer, TEXTS)

    clean = worker(TurnPolicy(smol_template, turns), smol_template, tmp_path, "clean", journal=False)
    clean.update_model_version(1)
    clean.start()
    try:
        take(clean, 2)  # group 0: two rollouts of four model calls each
    finally:
        clean.stop()
    expected = [json.loads(line) for line in (tmp_path / "clean.jsonl").read_text().splitlines()]

    stuck = StuckAt(smol_template, turns, stuck_at=6)  # both rollouts past two calls, the 5th and 6th calls hang
    first = worker(stuck, smol_template, tmp_path, "first")
    first.update_model_version(1)
    first.start()
    deadline = time.monotonic() + 30
    while stuck.calls < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    first.stop()  # the trainer goes down: its rollouts are cut off mid-episode
    assert (tmp_path / "journal").exists()

    again = TurnPolicy(smol_template, turns)
    second = worker(again, smol_template, tmp_path, "second")  # the restarted trainer, at version 2 from its checkpoint
    second.update_model_version(2)
    second.start()
    try:
        samples = take(second, 2)
    finally:
        second.stop()
    rows = [json.loads(line) for line in (tmp_path / "second.jsonl").read_text().splitlines()]
    assert sorted(row["repeat_index"] for row in rows) == [0, 1] and all(sample.group_id == 0 for sample in samples)
    for row, clean_row in zip(sorted(rows, key=lambda r: r["repeat_index"]), sorted(expected, key=lambda r: r["repeat_index"])):
        assert row["tokens"] == clean_row["tokens"]  # token for token
        versions = [item["policy_version"] for item in row["response"]["output"] if "generation_token_ids" in item]
        assert versions[:2] == [1, 1] and versions[-1] == 2  # the committed turns keep version 1
        assert row["metrics"]["policy_version_min"] == 1 and row["metrics"]["attempts"] == 2
    # the row carries its last call's version (2, "last_call"); its journaled turns' version 1 is in the span
    assert all(sample.model_version == 2 and sample.metrics["gym_bridge/row_version_span"] == 1.0 for sample in samples)
    assert not (tmp_path / "journal").exists()  # nothing left in flight
    assert again.calls == 8 - sum(row["metrics"]["resumed_from_turn"] for row in rows) <= 4
