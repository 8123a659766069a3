"""`snapshot()` at a turn boundary is environment code: it runs off the event loop under the tool timeout, within the
rollout's deadline, and whatever goes wrong in it (raises, hangs, returns bytes, too much) fails only its rollout as
`env`, naming `snapshot()`. An unchanged state is journaled once, and a resume still restores it."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.environment import Environment, VerifyResult, tool
from gym_bridge.core.journal import RunFingerprint, RunJournal
from gym_bridge.core.registry import register
from gym_bridge.core.task import parse_task
from tests.support.resume_kit import TurnPolicy, kill_then_resume, run

CALL = '<tool_call>\n{"name": "add", "arguments": {"n": 2}}\n</tool_call>'
never = threading.Event()
"""Never set: a snapshot waiting on it never returns."""


class Adder(Environment):
    """Adds 2 per call; the reward says whether the session's total came back right (3 calls: 6)."""

    resume = "snapshot"
    snapshot_sleep_s = 0.0
    ballast = ""

    def setup(self, task):
        self.total = 0

    @tool
    def add(self, n: int) -> str:
        """Add n.

        Args:
            n: How much.
        """
        self.total += n
        return str(self.total)

    def snapshot(self) -> Any:
        if self.snapshot_sleep_s:
            time.sleep(self.snapshot_sleep_s)
        return {"total": self.total, "ballast": self.ballast}

    def restore(self, task, state):
        self.total = state["total"]

    def verify(self, task, output):
        return VerifyResult(reward=float(self.total == 6))


@register
class SlowSnapshot(Adder):
    name = "slow_snapshot_for_test"
    snapshot_sleep_s = 15.0


@register
class HangingSnapshot(Adder):
    name = "hanging_snapshot_for_test"
    tool_timeout_s = 1.0

    def snapshot(self) -> Any:
        never.wait()


@register
class RaisingSnapshot(Adder):
    name = "raising_snapshot_for_test"

    def snapshot(self) -> Any:
        raise RuntimeError("the session is gone")


@register
class BytesSnapshot(Adder):
    name = "bytes_snapshot_for_test"

    def snapshot(self) -> Any:
        return b"\x00state"


@register
class HugeSnapshot(Adder):
    name = "huge_snapshot_for_test"
    max_snapshot_bytes = 1000
    ballast = "x" * 2000


@register
class SteadySnapshot(Adder):
    """The state the tools change is small; a large part of it never changes."""

    name = "steady_snapshot_for_test"
    ballast = "y" * 100_000

    def snapshot(self) -> Any:
        return {"ballast": self.ballast}

    def restore(self, task, state):
        assert state["ballast"] == self.ballast
        self.total = 6  # the three committed calls added 2 each


@register
class PlainAdder(Adder):
    name = "plain_adder_for_test"


@pytest.fixture
def script(turn):
    return [turn(CALL)] * 3 + [turn("done")]


def rows(*envs: str):
    return [parse_task({"prompt": "add 2 three times", "environment": env}, index=i) for i, env in enumerate(envs)]


def journaled_run(tmp_path, template, script, tasks, **config) -> dict[int, dict[str, Any]]:
    journal = RunJournal.prepare(tmp_path / "journal", RunFingerprint.of_run(model="scripted", tasks=tasks, settings={}), resume=False)
    try:
        return run(Engine(TurnPolicy(template, script), template, EngineConfig(**config)), tasks, journal)
    finally:
        asyncio.run(journal.close())


def test_a_slow_snapshot_does_not_outlast_the_deadline(tmp_path, smol_template, script):
    # before: snapshot() ran on the event loop, so the 3 s deadline fired only after its 15 s (16.5 s in issue 36)
    started = time.perf_counter()
    records = journaled_run(tmp_path, smol_template, script, rows(SlowSnapshot.name), deadline_s=3.0)
    elapsed_s = time.perf_counter() - started
    assert records[0]["failure_kind"] == "timeout" and elapsed_s < 6.0, (records[0]["failure_reason"], elapsed_s)


def test_a_snapshot_that_never_returns_fails_its_rollout_and_not_its_sibling(tmp_path, smol_template, script):
    records = journaled_run(tmp_path, smol_template, script, rows(HangingSnapshot.name, PlainAdder.name))
    assert records[0]["failure_kind"] == "env"
    assert records[0]["failure_reason"] == "snapshot() did not return within 1 s"
    assert records[1]["failure_kind"] is None and records[1]["reward"] == 1.0


@pytest.mark.parametrize(("env", "reason"), [
    (RaisingSnapshot.name, "snapshot() raised RuntimeError: the session is gone"),
    (BytesSnapshot.name, "snapshot() returned bytes, which is not JSON data"),
    # {"ballast":"<2000 x>","total":2}: 12 + 2000 + 12 bytes
    (HugeSnapshot.name, "snapshot() returned 2,024 bytes of JSON, above HugeSnapshot.max_snapshot_bytes (1,000)"),
])
def test_a_snapshot_that_fails_is_the_environments_failure_naming_snapshot(tmp_path, smol_template, script, env, reason):
    # before: raising or returning bytes failed as `infra` ("TypeError: Type is not JSON serializable: bytes"), and
    # any size was journaled
    record = journaled_run(tmp_path, smol_template, script, rows(env))[0]
    assert record["failure_kind"] == "env" and record["failure_reason"].startswith(reason), record["failure_reason"]


def test_an_unchanged_snapshot_is_journaled_once_and_still_restored(tmp_path, smol_template, script):
    sizes: list[int] = []

    def measure() -> None:
        sizes.append(sum(path.stat().st_size for path in (tmp_path / "journal").glob("*.log")))

    # killed at call 4: three commits (before calls 2, 3 and 4), each with the 100 kB state
    records, policy, _ = kill_then_resume(tmp_path / "journal", smol_template, script, rows(SteadySnapshot.name),
                                          kill_at=4, before_resume=measure)
    assert 100_000 < sizes[0] < 150_000  # once, not three times
    assert records[0]["reward"] == 1.0 and records[0]["metrics"]["resumed_from_turn"] == 3 and policy.calls == 1
