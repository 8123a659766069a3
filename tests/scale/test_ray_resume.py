"""`--ray` with a journal: a worker killed mid-run leaves its committed turns in its own file of the driver's journal,
and the group sent again continues on another worker from there, token for token, without generating a committed
turn again. In process (two `RolloutWorker`s over one journal, no cluster) by default; a real local Ray cluster with a
worker killed by SIGKILL in the `slow` test."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from gym_bridge.core.journal import RunFingerprint, RunJournal, journal_dir_for
from gym_bridge.core.rollout_file import read_records
from gym_bridge.eval.run import run_eval, select_tasks
from tests.scale.engines import TurnEngine

ray = pytest.importorskip("ray")

TURNS = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
         '<tool_call>\n{"name": "get_weather", "arguments": {"city": "London"}}\n</tool_call>',
         '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>',
         "Cold in Paris and London, mild in Rome.")


def _tasks(count: int):  # type: ignore[no-untyped-def]
    tasks = select_tasks(env_names=["weather"])
    return [replace(tasks[i % len(tasks)], index=i) for i in range(count)]


def _comparable(row: dict) -> tuple:
    return (row["tokens"], row["response"]["output"], row["reward"], row["metrics"]["finish_reason"])


def _calls(log: Path) -> Counter[str]:
    return Counter(log.read_text().split()) if log.exists() else Counter()


class _Killed(BaseException):
    """Stands in for SIGKILL of the worker process: nothing in the engine catches it."""


def test_a_group_sent_again_continues_on_another_worker_from_its_committed_turns(tmp_path):
    from ray import cloudpickle

    from gym_bridge.scale.ray_worker import JournalSpec, RolloutWorker

    tasks = _tasks(1)
    baseline_log, log = tmp_path / "baseline.calls", tmp_path / "calls"
    baseline = RolloutWorker(cloudpickle.dumps(TurnEngine(str(baseline_log), TURNS)), [])
    expected = [record.to_dict() for record in asyncio.run(baseline.run_group(tasks[0], [0, 1]))]

    first = RolloutWorker(cloudpickle.dumps(TurnEngine(str(log), TURNS, delay_s=0.01)), [])
    fingerprint = RunFingerprint.of_engine(first.engine.config, tasks)
    driver = RunJournal.prepare(tmp_path / "out.jsonl.journal", fingerprint, resume=False)
    spec = JournalSpec(str(driver.directory), fingerprint)
    policy = first.engine.policy
    generate = policy.generate

    async def dies_at_call_5(request):  # type: ignore[no-untyped-def]
        if sum(_calls(log).values()) >= 5:
            raise _Killed()
        return await generate(request)

    policy.generate = dies_at_call_5  # type: ignore[method-assign]
    with pytest.raises(_Killed):
        asyncio.run(first.run_group(tasks[0], [0, 1], spec))
    before = sum(_calls(log).values())
    assert len(list(driver.directory.glob("*.log"))) == 2  # the driver's journal file and the dead worker's

    second = RolloutWorker(cloudpickle.dumps(TurnEngine(str(log), TURNS)), [])
    records = [record.to_dict() for record in asyncio.run(second.run_group(tasks[0], [0, 1], replace(spec, resume=True)))]
    assert [_comparable(row) for row in records] == [_comparable(row) for row in expected]  # token for token
    assert all(row["metrics"]["attempts"] == 2 and row["metrics"]["resumed_from_turn"] >= 1 for row in records)
    extra = _calls(log) - _calls(baseline_log)
    assert sum(extra.values()) <= 2, extra  # at most the turn in flight of each of the 2 rollouts is generated again
    assert sum(_calls(log).values()) - before == 8 - sum(row["metrics"]["resumed_from_turn"] for row in records)
    asyncio.run(driver.close(complete=True))
    assert not driver.directory.exists()


def test_a_worker_that_does_not_see_the_journal_directory_is_refused(tmp_path):
    from ray import cloudpickle

    from gym_bridge.core.journal import JournalError
    from gym_bridge.scale.ray_worker import RolloutWorker

    worker = RolloutWorker(cloudpickle.dumps(TurnEngine(str(tmp_path / "calls"), TURNS)), [])
    assert "does not see the journal directory" in str(worker.journal_visible(str(tmp_path / "elsewhere")))
    with pytest.raises(JournalError, match="shared file system"):
        RunJournal.join(tmp_path / "elsewhere", RunFingerprint(model="m", tasks="t"))


@pytest.mark.ray
@pytest.mark.slow  # about 90 s with a local Ray cluster; by default: the in-process test above covers the mechanism
def test_a_killed_ray_worker_s_episodes_continue_on_another_worker(tmp_path):
    from gym_bridge.scale.ray_runner import RayRollouts, wait_for_workers
    from gym_bridge.scale.ray_cluster import RayOptions

    os.environ.setdefault("PYTHONPATH", os.getcwd())
    ray.init(address="local", num_cpus=2, object_store_memory=100 * 1024**2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"], "HF_HUB_OFFLINE": "1"}})
    tasks, baseline_log, log = _tasks(8), tmp_path / "baseline.calls", tmp_path / "calls"
    try:
        clean = RayRollouts(TurnEngine(str(baseline_log), TURNS), RayOptions(num_workers=2), max_concurrency=8, report=lambda line: None)
        try:
            asyncio.run(run_eval(clean, tasks, output=tmp_path / "baseline.jsonl", num_repeats=2))
        finally:
            clean.shutdown()
        lines: list[str] = []
        rollouts = RayRollouts(TurnEngine(str(log), TURNS, delay_s=0.3), RayOptions(num_workers=2, worker_concurrency=4),
                               max_concurrency=8, report=lines.append)
        rollouts.start(tasks, group_size=2)
        victim = wait_for_workers(rollouts)[0]

        def kill_mid_episode() -> None:  # every rollout of the first wave (4 on each worker) on its 2nd or 3rd model call
            deadline = time.monotonic() + 120
            while sum(_calls(log).values()) < 18 and time.monotonic() < deadline:
                time.sleep(0.01)
            os.kill(victim, signal.SIGKILL)

        killer = threading.Thread(target=kill_mid_episode, daemon=True)
        killer.start()
        try:
            asyncio.run(run_eval(rollouts, tasks, output=tmp_path / "out.jsonl", num_repeats=2, journal=True))
        finally:
            rollouts.shutdown()
    finally:
        ray.shutdown()
    expected = {(r["task_index"], r["repeat_index"]): r for r in read_records(tmp_path / "baseline.jsonl")}
    records = read_records(tmp_path / "out.jsonl")
    keys = [(r["task_index"], r["repeat_index"]) for r in records]
    assert sorted(keys) == sorted(expected) and len(set(keys)) == len(keys) == 16  # every (task, repeat) exactly once
    assert all(_comparable(r) == _comparable(expected[(r["task_index"], r["repeat_index"])]) for r in records)
    assert any("running it again" in line for line in lines)  # the killed worker's groups were sent again
    resumed = [r for r in records if r["metrics"].get("resumed_from_turn")]
    assert resumed, "no episode continued mid-way: the kill missed every episode in flight"
    extra = _calls(log) - _calls(baseline_log)
    assert sum(extra.values()) <= 4, extra  # at most one call per rollout in flight on the killed worker (4)
    assert not journal_dir_for(tmp_path / "out.jsonl").exists()
