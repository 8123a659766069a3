"""Resource limits of harness commands (RLIMIT_DATA, RLIMIT_CPU), with real commands.

Every process a command starts inherits its limits (the reaper sets them in the command before exec, not
in itself). A command that allocates or spins past its limit fails its rollout as `env` with a reason naming
the limit and the setting that changes it; its siblings in the same run still score.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from gym_bridge.capture import HarnessEnvironment
from gym_bridge.capture.harness import DEFAULT_CPU_LIMIT_S, DEFAULT_MEMORY_LIMIT_MB, HarnessLimits, run_command
from gym_bridge.core.errors import UserError
from gym_bridge.core.registry import register
from gym_bridge.core.task import parse_task
from tests.capture.test_harness_hardening import CALL_ONCE, engine, example_row, rollout, shell_env

ALLOCATE_1_GIB = "x = bytes(1 << 30)"
"""calloc of 1 GiB: fresh pages, so it costs no memory where it is allowed, and fails past a smaller RLIMIT_DATA."""
SPIN = "while True: pass"
IGNORE_SIGXCPU = "import signal; signal.signal(signal.SIGXCPU, signal.SIG_IGN)"


def python(*statements: str) -> list[str]:
    return [sys.executable, "-c", "\n".join(statements)]


def test_every_process_of_a_command_gets_the_limits_but_not_the_reaper(smol_template, turn) -> None:
    # a child shell prints its limits (ulimit: KiB and seconds); $PPID of the command is its reaper
    script = ('sh -c "ulimit -d; ulimit -t"; grep -E "Max (data size|cpu time)" /proc/$PPID/limits; '
              'exec "$0" -c "$1"')
    record = rollout(engine(smol_template, {"": [turn("42")]}), shell_env(script))
    assert record["failure_kind"] is None and record["reward"] == 1.0, record["failure_reason"]
    lines = record["metrics"]["verify"]["stdout_tail"].splitlines()
    assert lines[:2] == [str(DEFAULT_MEMORY_LIMIT_MB * 1024), str(DEFAULT_CPU_LIMIT_S)]  # 8192 MiB = 8388608 KiB; 600 s
    own = [line for line in Path("/proc/self/limits").read_text().splitlines() if line.startswith(("Max cpu time", "Max data size"))]
    assert lines[2:4] == own and len(lines) == 5, lines  # the reaper keeps the trainer's own limits

    configured = shell_env(script, harness_memory_limit_mb=256, harness_cpu_limit_s=7)
    record = rollout(engine(smol_template, {"": [turn("42")]}), configured)
    assert record["metrics"]["verify"]["stdout_tail"].splitlines()[:2] == ["262144", "7"]  # 256 * 1024 KiB

    unlimited = shell_env(script, harness_memory_limit_mb=None, harness_cpu_limit_s=None)
    record = rollout(engine(smol_template, {"": [turn("42")]}), unlimited)
    assert record["metrics"]["verify"]["stdout_tail"].splitlines()[:2] == ["unlimited", "unlimited"]


def test_a_harness_that_allocates_past_its_memory_limit_fails_as_env_naming_the_limit(smol_template, turn) -> None:
    script = 'exec "$0" -c "' + ALLOCATE_1_GIB + '; $1"'
    allowed = rollout(engine(smol_template, {"": [turn("42")]}), shell_env(script))  # under the default 8 GiB: it runs
    assert allowed["failure_kind"] is None and allowed["reward"] == 1.0, allowed["failure_reason"]

    record = rollout(engine(smol_template, {"": [turn("42")]}), shell_env(script, harness_memory_limit_mb=256))
    assert record["failure_kind"] == "env" and record["mask_sample"]
    reason = record["failure_reason"]
    assert reason.startswith("the harness ran out of memory under its limit of 256 MiB per process (RLIMIT_DATA, harness_memory_limit_mb)")
    assert "exited with status 1" in reason and "MemoryError" in reason


def test_a_harness_that_spins_past_its_cpu_limit_fails_as_env_naming_the_limit(smol_template) -> None:
    record = rollout(engine(smol_template, {"": []}), shell_env(f'exec "$0" -c "{SPIN}"', harness_cpu_limit_s=1))
    assert record["failure_kind"] == "env" and record["mask_sample"]
    assert record["failure_reason"].startswith("the harness hit its CPU limit of 1 s per process (RLIMIT_CPU, harness_cpu_limit_s); ")
    assert "exited with status -24" in record["failure_reason"]  # SIGXCPU

    # a shell whose child ignores SIGXCPU: the hard limit's SIGKILL, so the shell exits 137 (issue 36)
    ignoring = shell_env(f'"$0" -c "{IGNORE_SIGXCPU}\n{SPIN}"; exit $?', harness_cpu_limit_s=1)
    record = rollout(engine(smol_template, {"": []}), ignoring)
    assert record["failure_kind"] == "env" and "exited with status 137" in record["failure_reason"]
    assert record["failure_reason"].startswith("the harness hit its CPU limit of 1 s per process (RLIMIT_CPU, harness_cpu_limit_s); ")


@pytest.mark.parametrize(("argv", "status"), [
    (python(IGNORE_SIGXCPU, SPIN), -9),  # ignores SIGXCPU: SIGKILL at the hard limit, one second later
    (["sh", "-c", f'"$0" -c "{SPIN}"; exit $?', sys.executable], 128 + 24),  # a grandchild: its shell says 128 + SIGXCPU
    # a grandchild that ignores SIGXCPU: SIGKILL at the hard limit, so its shell says 128 + SIGKILL (named since issue 36)
    (["sh", "-c", '"$0" -c "$1"; exit $?', sys.executable, f"{IGNORE_SIGXCPU}\n{SPIN}"], 128 + 9),
])
def test_the_cpu_limit_is_named_for_a_process_that_ignores_sigxcpu_and_for_a_child(argv, status) -> None:
    outcome = asyncio.run(run_command(argv, env={"PATH": "/usr/bin:/bin"}, stdin=b"", timeout_s=30, stop=asyncio.Event(),
                                      limits=HarnessLimits(memory_mb=None, cpu_s=1)))
    assert (outcome.exit_code, outcome.limit, outcome.timed_out) == (status, "cpu", False)


def test_a_plain_failure_names_no_limit() -> None:
    outcome = asyncio.run(run_command(python("raise SystemExit(3)"), env={}, stdin=b"", timeout_s=30, stop=asyncio.Event()))
    assert (outcome.exit_code, outcome.limit) == (3, None) and outcome.cpu_s is not None


class Limited(HarnessEnvironment):
    name = "harness_limits_rows"
    allow_row_commands = True
    harness_memory_limit_mb = 256
    harness_cpu_limit_s = 3  # a sibling's Python start and `import openai` take about 1 s of CPU on a loaded 2-core box

    def score(self, task, answer):  # type: ignore[no-untyped-def]
        return float(answer.strip() == "42")


def test_siblings_of_harnesses_killed_by_their_limits_still_score(smol_template, turn) -> None:
    register(Limited)
    commands = [python(ALLOCATE_1_GIB), python(SPIN), python(CALL_ONCE), python(CALL_ONCE)]
    tasks = [parse_task({**example_row(), "agent_ref": {"name": Limited.name}, "harness": {"command": command}},
                        index=index, source=f"rows.jsonl:{index + 1}") for index, command in enumerate(commands)]

    async def run_all() -> list:
        return [record async for record in engine(smol_template, {"": [turn("42")]}, deadline_s=60.0).stream(tasks)]

    records = {record.task_index: record.to_dict() for record in asyncio.run(run_all())}
    assert sorted(records) == [0, 1, 2, 3]
    assert records[0]["failure_kind"] == "env" and "out of memory under its limit of 256 MiB" in records[0]["failure_reason"]
    assert records[1]["failure_kind"] == "env" and "CPU limit of 3 s" in records[1]["failure_reason"]
    for sibling in (records[2], records[3]):
        assert sibling["failure_kind"] is None and sibling["reward"] == 1.0, sibling["failure_reason"]


@pytest.mark.parametrize("value", [0, -5, 2.5, "1G", True])
def test_a_malformed_limit_is_refused_before_a_run(value) -> None:
    for key in ("harness_memory_limit_mb", "harness_cpu_limit_s"):
        with pytest.raises(UserError, match=f"{key} must be a whole number"):
            shell_env("true", **{key: value}).check_ready()
    shell_env("true", harness_memory_limit_mb=None, harness_cpu_limit_s=None).check_ready()


def test_eval_s_env_setting_changes_or_lifts_a_limit() -> None:
    from gym_bridge.cli.eval_engine import _apply_env_options
    from gym_bridge.core.trust import DEFAULT_TRUST
    from gym_bridge.core.registry import get_environment

    register(Limited)
    _apply_env_options([f"{Limited.name}.harness_cpu_limit_s=5", f"{Limited.name}.harness_memory_limit_mb=null"], [], DEFAULT_TRUST)
    configured = get_environment(Limited.name)
    assert issubclass(configured, HarnessEnvironment)
    assert configured.harness_limits() == HarnessLimits(memory_mb=None, cpu_s=5)
    assert HarnessLimits().to_args() == ["data=8589934592", "cpu=600"]  # 8192 * 1024 * 1024 bytes
    register(Limited)
