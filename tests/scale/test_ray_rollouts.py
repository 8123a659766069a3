"""Rollouts on a local Ray cluster (2 CPUs, one per test module) give the local engine's records,
survive a worker killed mid-run, keep groups whole, and refuse what cannot run before it starts."""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import replace

import pytest

from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.errors import GymBridgeError
from gym_bridge.eval.run import run_eval, select_tasks
from gym_bridge.scale.ray_runner import RayRollouts, wait_for_workers
from gym_bridge.scale.ray_cluster import RayOptions
from tests.scale.engines import ScriptedEngine, policy_settings, scripted_policy

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    os.environ.setdefault("PYTHONPATH", os.getcwd())
    ray.init(address="local", num_cpus=2, resources={"sandbox": 2}, object_store_memory=100 * 1024**2, include_dashboard=False,
             log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"], "HF_HUB_OFFLINE": "1"}})
    yield
    ray.shutdown()


def _comparable(record) -> dict:  # type: ignore[no-untyped-def]
    row = record.to_dict()
    row["metrics"].pop("latency_s")
    return row


def _weather_tasks(count: int):  # type: ignore[no-untyped-def]
    tasks = select_tasks(env_names=["weather"])
    return [replace(tasks[i % len(tasks)], index=i) for i in range(count)]


def test_ray_records_equal_the_local_engine_s(smol_tokenizer, smol_template):
    tasks = _weather_tasks(6)
    local = Engine(scripted_policy(smol_tokenizer), smol_template, EngineConfig(model_name="scripted"))
    expected = asyncio.run(local.run_groups(tasks, group_size=2))
    rollouts = RayRollouts(ScriptedEngine(), RayOptions(num_workers=2), max_concurrency=8, report=lambda line: None)
    try:
        got = asyncio.run(rollouts.run_groups(tasks, group_size=2))
    finally:
        rollouts.shutdown()
    assert [[_comparable(r) for r in group] for group in got] == [[_comparable(r) for r in group] for group in expected]
    assert all(not r.failed and r.reward == 1.0 for group in got for r in group)  # the script answers right: reward 1
    assert rollouts.plan is not None and rollouts.plan.effective == 8  # 2 workers x 4 rollouts each


def _run_and_kill(tmp_path, *, max_retries: int):  # type: ignore[no-untyped-def]
    """16 rollouts (8 tasks x 2) of 0.3 s per model call on 2 workers of 2 rollouts each; one worker is
    killed with SIGKILL once the first group is written. Returns the records and what was killed."""
    tasks = _weather_tasks(8)
    lines: list[str] = []
    rollouts = RayRollouts(ScriptedEngine(delay_s=0.3), RayOptions(num_workers=2, worker_concurrency=2, max_retries=max_retries),
                           max_concurrency=4, report=lines.append)
    rollouts.start(tasks, group_size=2)
    victims = wait_for_workers(rollouts)[:1]

    class KillOnce:  # a RunObserver: kills the worker once the first record is written
        def started(self, tasks, *, repeats):  # type: ignore[no-untyped-def]
            pass

        def record_done(self, row: dict) -> None:
            while victims:
                os.kill(victims.pop(), signal.SIGKILL)

        def finished(self) -> None:
            pass

    try:
        result = asyncio.run(run_eval(rollouts, tasks, output=tmp_path / "out.jsonl", num_repeats=2, observer=KillOnce()))
    finally:
        rollouts.shutdown()
    records = [line for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    return result, records, lines


@pytest.mark.slow  # about 30 s; by default: Ray rollouts above, a killed eval resumed in eval/test_kill_resume.py
def test_a_worker_killed_mid_run_loses_nothing(tmp_path):
    import json

    result, lines, report = _run_and_kill(tmp_path, max_retries=2)
    rows = [json.loads(line) for line in lines]
    pairs = sorted((row["task_index"], row["repeat_index"]) for row in rows)
    assert pairs == [(t, r) for t in range(8) for r in range(2)]  # every (task, repeat) exactly once
    assert [row["failure_kind"] for row in rows] == [None] * 16
    assert any("running it again" in line for line in report)  # the killed worker's groups ran again
    assert result.summary["rollouts"] == 16


@pytest.mark.slow
def test_without_retries_the_lost_groups_are_infra_failures(tmp_path):
    import json

    _, lines, report = _run_and_kill(tmp_path, max_retries=0)
    rows = [json.loads(line) for line in lines]
    pairs = sorted((row["task_index"], row["repeat_index"]) for row in rows)
    assert pairs == [(t, r) for t in range(8) for r in range(2)]
    failed = [row for row in rows if row["failure_kind"]]
    assert failed and {row["failure_kind"] for row in failed} == {"infra"}
    assert all(row["mask_sample"] and "Ray worker lost" in row["failure_reason"] for row in failed)
    groups = {}
    for row in failed:  # a group is lost whole, never half of it
        groups.setdefault(row["task_index"], []).append(row["repeat_index"])
    assert all(sorted(repeats) == [0, 1] for repeats in groups.values())


@pytest.mark.slow
def test_workers_are_placed_by_the_environment_s_resources(smol_tokenizer):
    tasks = [replace(task, env_name="tests.scale.engines:SandboxWeather") for task in _weather_tasks(2)]
    rollouts = RayRollouts(ScriptedEngine(), RayOptions(num_workers=2), max_concurrency=4, report=lambda line: None)
    try:
        records = asyncio.run(rollouts.run_groups(tasks, group_size=1))
    finally:
        rollouts.shutdown()
    assert [r[0].env for r in records] == ["weather_sandboxed", "weather_sandboxed"] and not any(r[0].failed for r in records)

    gpu_tasks = [replace(task, env_name="tests.scale.engines:GpuWeather") for task in _weather_tasks(1)]
    with pytest.raises(GymBridgeError, match="no node of the Ray cluster has the resources.*num_gpus"):
        RayRollouts(ScriptedEngine(), RayOptions(num_workers=1), report=lambda line: None).start(gpu_tasks)


@pytest.mark.slow
def test_three_sandbox_workers_do_not_fit_two_sandboxes_and_the_statement_says_so():
    tasks = [replace(task, env_name="tests.scale.engines:SandboxWeather") for task in _weather_tasks(4)]
    lines: list[str] = []
    rollouts = RayRollouts(ScriptedEngine(), RayOptions(num_workers=3, worker_concurrency=4), max_concurrency=12, report=lines.append)
    try:
        records = asyncio.run(rollouts.run_groups(tasks, group_size=1))
    finally:
        rollouts.shutdown()
    assert len(records) == 4 and not any(group[0].failed for group in records)
    # the cluster has 2 `sandbox` units, each worker asks for 1: 2 workers x 4 rollouts = 8 of the 12 asked
    assert any("ray: 2 workers for tests.scale.engines:SandboxWeather" in line for line in lines)
    assert any("cluster resources (room for 2 of 3 workers) caps rollouts in flight at 8, below the 12 asked" in line for line in lines)


@pytest.mark.slow
def test_trainer_path_workers_generate_on_the_replicas_with_affinity(smol_template):
    """What `RolloutOptions(ray=...)` runs: workers rebuilding the trainer's engine over its vLLM servers
    (stub replicas here); a batch's pairs come back in order, a task's repeats on one worker."""
    from gym_bridge.policies.factory import PolicySpec
    from gym_bridge.scale.ray_worker import RemoteEngineFactory
    from tests.scale.stub_replicas import stub_replicas

    tasks = _weather_tasks(4)
    pairs = [(task, repeat) for task in tasks for repeat in (0, 1)][1:]  # the first group starts on an earlier rank
    with stub_replicas(2, delay_s=0.01) as replicas:
        spec = PolicySpec(kind="remote", model="stub", base_urls=tuple(r.url for r in replicas))
        factory = RemoteEngineFactory(spec, smol_template, EngineConfig(model_name="stub"))
        rollouts = RayRollouts(factory, RayOptions(num_workers=2), max_concurrency=8, report=lambda line: None)
        try:
            records = asyncio.run(rollouts.run_pairs(pairs))
            stats = rollouts.replica_stats()
        finally:
            rollouts.shutdown()
    assert [(r.task.index, r.repeat_index) for r in records] == [(t.index, i) for t, i in pairs]
    assert all(r.reward == 1.0 and not r.failed for r in records)
    assert stats["affinity_hit_rate"] == 1.0 and sum(r["episodes"] for r in stats["replicas"]) == 7


def test_trainer_path_workers_keep_the_trainer_s_request_timeout_and_retries(smol_template):
    """`RolloutOptions(server_request_timeout_s=..., server_max_retries=...)` reach the policy each Ray
    worker builds: a replica slower than the timeout fails the rollouts as `infra` on the workers too
    (not after the policy's default of 120 s), and the worker's policy has the driver's settings, the
    tokenizer's size its answers' ids are checked against included."""
    from gym_bridge.trl._options import RolloutOptions
    from gym_bridge.trl._backend import on_ray
    from gym_bridge.policies.remote import RemotePolicy
    from tests.scale.stub_replicas import stub_replicas

    tasks = _weather_tasks(2)
    options = RolloutOptions(server_request_timeout_s=0.5, server_max_retries=0, ray=RayOptions(num_workers=1))
    with stub_replicas(1, delay_s=3.0) as replicas:
        driver_policy = RemotePolicy([replicas[0].url], model="stub", request_timeout_s=0.5, max_retries=0,
                                     vocab_size=len(smol_template.tokenizer))
        rollouts = on_ray(options, "vllm_server", driver_policy, smol_template, EngineConfig(model_name="stub"))
        assert rollouts is not None
        rollouts.report = lambda line: None
        try:
            records = asyncio.run(rollouts.run_pairs([(task, 0) for task in tasks]))
        finally:
            rollouts.shutdown()
        worker_policy = ray.get(ray.remote(policy_settings).remote(rollouts.build_engine))
    assert all(r.failed and r.failure_kind == "infra" and "timed out after 0.5 s" in (r.failure_reason or "") for r in records), [
        (r.failure_kind, r.failure_reason) for r in records]
    assert worker_policy == policy_settings(lambda: Engine(driver_policy, smol_template, EngineConfig(model_name="stub")))

