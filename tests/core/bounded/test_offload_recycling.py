"""Worker processes are recycled (issue 19, item 13): after `max_tasks_per_worker` calls, or once a call
leaves them above `max_memory_mb`, so an isolated environment that leaks cannot grow a worker forever."""

from __future__ import annotations

import asyncio
import os

import pytest

from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.environment import Environment, VerifyResult, tool
from gym_bridge.core.bounded.offload import (
    DEFAULT_MAX_TASKS_PER_WORKER,
    DEFAULT_MAX_WORKER_MEMORY_MB,
    run_in_process,
    set_pool_size,
    set_worker_limits,
    shutdown_pool,
)
from gym_bridge.core.policy import SamplingParams, ScriptedPolicy
from gym_bridge.core.task import parse_task

_kept: list[bytes] = []
"""What `leak` keeps alive in its worker, as leaking environment code would."""


def leak(mib: int) -> tuple[int, float]:
    """Keep `mib` MiB alive in this worker; return its pid and resident memory in MiB."""
    _kept.append(b"x" * (mib << 20))
    with open(f"/proc/{os.getpid()}/statm", encoding="ascii") as handle:
        resident = int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
    return os.getpid(), resident


@pytest.fixture
def one_worker():
    shutdown_pool()  # idle workers of earlier tests have calls counted already: start from fresh ones
    set_pool_size(1)
    yield
    set_worker_limits()
    set_pool_size(min(2, os.cpu_count() or 1))


def calls(n: int, mib: int) -> list[tuple[int, float]]:
    async def go() -> list[tuple[int, float]]:
        return [await run_in_process(leak, mib, timeout_s=60) for _ in range(n)]

    return asyncio.run(go())


def test_a_worker_is_recycled_after_max_tasks_per_worker_calls(one_worker) -> None:
    set_worker_limits(max_tasks_per_worker=3, max_memory_mb=None)
    pids = [pid for pid, _ in calls(7, 0)]
    assert pids[0] == pids[1] == pids[2] != pids[3] == pids[4] == pids[5] != pids[6]      # 3 + 3 + 1
    assert len(set(pids)) == 3


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="resident memory is read from /proc (Linux)")
def test_a_worker_that_grows_past_max_memory_mb_is_recycled(one_worker) -> None:
    """Each call keeps 64 MiB more: with the limit 100 MiB above a fresh worker's memory, the worker
    that passes it after its second call is replaced, and its successor starts small again."""
    set_worker_limits(max_tasks_per_worker=None, max_memory_mb=None)
    (_, fresh), = calls(1, 0)
    set_worker_limits(max_tasks_per_worker=None, max_memory_mb=fresh + 100)
    seen = calls(4, 64)
    pids = [pid for pid, _ in seen]
    assert seen[0][1] < fresh + 100 < seen[1][1]                  # under the limit, then over it
    assert pids[0] == pids[1] != pids[2] == pids[3]
    assert seen[2][1] < fresh + 100


def test_the_limits_are_checked_and_have_documented_defaults() -> None:
    assert (DEFAULT_MAX_TASKS_PER_WORKER, DEFAULT_MAX_WORKER_MEMORY_MB) == (1000, 2048.0)
    with pytest.raises(ValueError, match="max_tasks_per_worker"):
        set_worker_limits(max_tasks_per_worker=0)
    with pytest.raises(ValueError, match="max_memory_mb"):
        set_worker_limits(max_memory_mb=-1)


class LeakyIsolated(Environment):
    """An isolated environment whose tool leaks 1 MiB per call and reports the worker it ran in."""

    name = "leaky_isolated_for_recycling_test"
    isolate_tools = True

    @tool
    def where(self) -> int:
        """Say which process ran this."""
        return leak(1)[0]

    def verify(self, task, output):
        return VerifyResult(reward=1.0)


def test_isolated_environment_calls_run_in_recycled_workers(one_worker, smol_template, turn) -> None:
    """Each rollout makes two isolated calls (the tool, verify): with `max_tasks_per_worker=2` every
    rollout gets a fresh worker."""
    set_worker_limits(max_tasks_per_worker=2, max_memory_mb=None)
    policy = ScriptedPolicy({"": [turn('<tool_call>\n{"name": "where", "arguments": {}}\n</tool_call>'), turn("Done.")]})
    engine = Engine(policy, smol_template, EngineConfig(sampling=SamplingParams(max_new_tokens=32)))

    async def go():
        return [await engine.rollout(parse_task({"prompt": "Go.", "environment": LeakyIsolated.name}, index=i),
                                     env_class=LeakyIsolated) for i in range(3)]

    records = asyncio.run(go())
    assert all(record.failure_kind is None for record in records), [record.failure_reason for record in records]
    pids = [next(item["output"] for item in record.output if item["type"] == "function_call_output") for record in records]
    assert len(set(pids)) == 3
