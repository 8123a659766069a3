"""Harness commands under an adversary (issue 28, items 1, 2, 6 and 7), with real shell commands.

Rows may not name the command their harness runs unless allowed (never with limited module paths,
never behind `/run`); a command gets a minimal environment; a command's exit ends its run whatever
its children do, and nothing it started survives the run (its process group, `setsid`, daemons);
the wall limit also bounds writing the task to stdin.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import httpx
import pytest

from environments.harness_example import HarnessExampleEnvironment
from gym_bridge.capture import HarnessEnvironment
from gym_bridge.cli import main
from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.policy import SamplingParams, ScriptedPolicy
from gym_bridge.core.registry import register
from gym_bridge.core.task import parse_task
from gym_bridge.core.environment import row_problems
from gym_bridge.core.trust import DEFAULT_TRUST, TrustSettings

EXAMPLE = Path(__file__).parents[2] / "environments" / "harness_example" / "data" / "example.jsonl"
CALL_ONCE = ("import json, os, sys, openai; task = json.load(open(os.environ['GYM_BRIDGE_TASK_FILE'])); "
             "c = openai.OpenAI(max_retries=0); "
             "r = c.chat.completions.create(model=os.environ['OPENAI_MODEL'], messages=task['messages']); "
             "print(r.choices[0].message.content)")
"""A one-call agent that reads its task from the file, never from stdin."""


def example_row(**extra: object) -> dict:
    return {**json.loads(EXAMPLE.read_text().splitlines()[0]), **extra}


def engine(template, script, *, deadline_s: float = 30.0, trust: TrustSettings = DEFAULT_TRUST) -> Engine:  # type: ignore[no-untyped-def]
    config = EngineConfig(sampling=SamplingParams(max_new_tokens=64), limits=Limits(), deadline_s=deadline_s, template_check="off")
    return Engine(ScriptedPolicy(script), template, config, trust=trust)


def rollout(engine_: Engine, env_class: type[HarnessEnvironment], row: dict | None = None) -> dict:
    task = parse_task(row or example_row(), index=0, source="rows.jsonl:1")
    return asyncio.run(engine_.rollout(task, env_class=env_class)).to_dict()


def shell_env(script: str, *, timeout_s: float = 20.0, **attributes: object) -> type[HarnessEnvironment]:
    """A harness whose command is `sh -c script`; `$0` is this interpreter and `$1` the one-call agent."""

    class Shell(HarnessEnvironment):
        name = "shell_harness"
        command = ("sh", "-c", script, sys.executable, CALL_ONCE)
        harness_timeout_s = timeout_s

        def score(self, task, answer):  # type: ignore[no-untyped-def]
            return float(answer.strip() == "42")

    for key, value in attributes.items():
        setattr(Shell, key, value)
    return Shell


def gone(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rpartition(")")[2].split()[0] == "Z"  # a zombie: dead, waiting for its reaper
    except OSError:
        return True


def wait_gone(pid: int, within_s: float = 2.0) -> bool:
    give_up = time.monotonic() + within_s
    while not gone(pid):
        if time.monotonic() > give_up:
            os.kill(pid, 9)  # do not leave it behind; the test fails anyway
            return False
        time.sleep(0.05)
    return True


# -- item 1: commands from rows ----------------------------------------------------------------------


class AllowingExample(HarnessExampleEnvironment):
    name = "harness_example_row_commands"
    allow_row_commands = True


def marker_row(marker: Path) -> dict:
    return example_row(harness={"command": ["sh", "-c", f"touch {marker}"]})


def test_a_row_command_is_refused_by_default_and_never_runs(smol_template, tmp_path) -> None:
    marker = tmp_path / "ran"
    assert HarnessExampleEnvironment.validate_row(marker_row(marker)) == []  # well formed; whether it may run is the trust's
    problems = row_problems(HarnessExampleEnvironment, marker_row(marker))
    assert [problem.field for problem in problems] == ["harness.command"]
    assert "allow_row_commands = True" in problems[0].message and "--allow-row-commands" in problems[0].message
    record = rollout(engine(smol_template, {"": []}), HarnessExampleEnvironment, marker_row(marker))  # a row that skipped validation
    assert record["failure_kind"] == "env" and "harness.command: rows may not name their own command" in record["failure_reason"]
    assert not marker.exists()


def test_an_environment_or_the_run_may_allow_row_commands_but_never_with_limited_module_paths(smol_template, turn, tmp_path) -> None:
    row = example_row(harness={"command": [sys.executable, "-c", CALL_ONCE]})
    assert row_problems(AllowingExample, row) == []
    record = rollout(engine(smol_template, {"": [turn("42")]}), AllowingExample, row)
    assert record["failure_kind"] is None and record["reward"] == 1.0, record["failure_reason"]
    allowing = TrustSettings(row_commands=True)  # --allow-row-commands
    assert row_problems(HarnessExampleEnvironment, row, allowing) == []
    shared = TrustSettings.limited_to([])  # --no-module-paths
    for env_class in (HarnessExampleEnvironment, AllowingExample):
        problems = row_problems(env_class, marker_row(tmp_path / "ran"), shared)
        assert [p.field for p in problems] == ["harness.command"] and "--no-module-paths" in problems[0].message
    record = rollout(engine(smol_template, {"": []}, trust=shared), AllowingExample, marker_row(tmp_path / "ran"))
    assert record["failure_kind"] == "env" and "module paths are limited" in record["failure_reason"]
    assert not (tmp_path / "ran").exists()
    malformed = AllowingExample.validate_row(example_row(harness={"command": "sh -c id"}))
    assert [p.field for p in malformed] == ["harness.command"] and "list of strings" in malformed[0].message


def write_rows(path: Path, *rows: dict) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_data_validate_names_the_row_that_names_a_command(tmp_path, capsys) -> None:
    rows = write_rows(tmp_path / "shared.jsonl", example_row(), marker_row(tmp_path / "ran"))
    assert main(["data", "validate", str(rows)]) == 1
    captured = capsys.readouterr()
    assert f"{rows}:2: harness.command: rows may not name their own command" in captured.err
    assert f"{rows}:1" not in captured.err and "1 problem(s)" in captured.out
    register(AllowingExample)  # where the environment allows row commands, the row is valid and still named
    allowed = write_rows(tmp_path / "allowed.jsonl", {**marker_row(tmp_path / "ran"), "agent_ref": {"name": AllowingExample.name}})
    assert main(["data", "validate", str(allowed)]) == 0
    captured = capsys.readouterr()
    assert f"warning: {allowed}:1: harness.command: names the command its harness runs" in captured.err
    assert "ok, 1 warning(s)" in captured.out


@pytest.mark.parametrize(("flags", "says"), [
    ([], "set `allow_row_commands = True` on HarnessExampleEnvironment"),
    (["--no-module-paths"], "while module paths are limited (--no-module-paths"),
    (["--no-module-paths", "--allow-row-commands"], "--allow-row-commands cannot be combined with --no-module-paths"),
])
def test_eval_refuses_a_row_command_before_any_rollout(tmp_path, capsys, flags, says) -> None:
    marker = tmp_path / "ran"
    rows = write_rows(tmp_path / "shared.jsonl", marker_row(marker))
    output = tmp_path / "out.jsonl"
    assert main(["eval", "--data", str(rows), "--output", str(output), "--no-progress", *flags]) == 2
    assert says in capsys.readouterr().err
    assert not marker.exists() and not output.exists()


def test_eval_allow_row_commands_lasts_for_its_run_only(tmp_path, capsys) -> None:
    rows = write_rows(tmp_path / "shared.jsonl", marker_row(tmp_path / "ran"))
    # passes the row check, then stops at a model server that is not there: the flag was in force, and is reset after
    assert main(["eval", "--data", str(rows), "--output", str(tmp_path / "out.jsonl"), "--no-progress",
                 "--allow-row-commands", "--base-url", "http://127.0.0.1:9/v1"]) == 2
    error = capsys.readouterr().err
    assert "127.0.0.1:9" in error and "harness.command" not in error
    assert main(["eval", "--data", str(rows), "--output", str(tmp_path / "out.jsonl"), "--no-progress",
                 "--base-url", "http://127.0.0.1:9/v1"]) == 2  # the next run in this process: refused again
    assert "harness.command: rows may not name their own command" in capsys.readouterr().err


def test_two_runs_in_one_process_each_run_a_row_command_by_their_own_settings(smol_template, turn, tmp_path) -> None:
    """Two engines at once in one event loop, one with `--allow-row-commands`' settings and one with the default: the
    same row's command runs in the first and is refused in the second (with process-wide toggles one setting held for both)."""
    marker = tmp_path / "ran"
    row = example_row(harness={"command": ["sh", "-c", f"touch {marker}; exec \"$0\" -c \"$1\"", sys.executable, CALL_ONCE]})
    task = parse_task(row, index=0, source="rows.jsonl:1")
    allowed = engine(smol_template, {"": [turn("42")]}, trust=TrustSettings(row_commands=True))
    default = engine(smol_template, {"": [turn("42")]})

    async def both() -> list[dict]:
        records = await asyncio.gather(allowed.rollout(task, env_class=HarnessExampleEnvironment),
                                       default.rollout(task, env_class=HarnessExampleEnvironment))
        return [record.to_dict() for record in records]

    ran, refused = asyncio.run(both())
    assert ran["failure_kind"] is None and ran["reward"] == 1.0, ran["failure_reason"]
    assert refused["failure_kind"] == "env" and "harness.command: rows may not name their own command" in refused["failure_reason"]
    assert marker.exists()  # by the allowed run only: the refused one never starts a process


def test_a_run_body_may_not_name_a_command_even_where_the_environment_allows_it(tmp_path) -> None:
    from gym_bridge.serve.agent_server import AgentServerSettings, build_app
    from tests.support.http_server import app_in_thread

    register(AllowingExample)
    marker = tmp_path / "ran"
    row = {**marker_row(marker), "agent_ref": {"type": "responses_api_agents", "name": AllowingExample.name}}
    settings = AgentServerSettings(envs=(AllowingExample.name,), model_base_urls=("http://127.0.0.1:9/v1",), model="m")
    with app_in_thread(build_app(settings)) as url:
        answer = httpx.post(url + "/run", json=row, timeout=30)
    assert answer.status_code == 422 and answer.json()["field"] == "harness.command"
    assert "may not name the command its harness runs" in answer.json()["detail"]
    assert not marker.exists()


# -- item 2: the environment of a command ------------------------------------------------------------


def test_a_command_gets_a_minimal_environment_plus_what_is_allowed(smol_template, turn, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    monkeypatch.setenv("WANDB_API_KEY", "wandb_secret_value")
    monkeypatch.setenv("UNLISTED_SETTING", "not passed")
    script = 'env; exec "$0" -c "$1"'
    record = rollout(engine(smol_template, {"": [turn("42")]}), shell_env(script))
    assert record["failure_kind"] is None, record["failure_reason"]
    printed = dict(line.split("=", 1) for line in record["metrics"]["verify"]["stdout_tail"].splitlines() if "=" in line)
    assert "hf_secret_value" not in json.dumps(record) and "wandb_secret_value" not in json.dumps(record)
    assert {"PATH", "HOME", "OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_MODEL", "GYM_BRIDGE_TASK_FILE"} <= set(printed)
    assert printed["PATH"] == os.environ["PATH"] and "UNLISTED_SETTING" not in printed
    allowed = shell_env(script, harness_env_vars=("HF_TOKEN",))
    record = rollout(engine(smol_template, {"": [turn("42")]}), allowed)
    assert "HF_TOKEN=hf_secret_value" in record["metrics"]["verify"]["stdout_tail"]
    assert "wandb_secret_value" not in json.dumps(record)


def test_a_malformed_allow_list_is_refused_before_a_run() -> None:
    from gym_bridge.core.errors import UserError

    with pytest.raises(UserError, match="harness_env_vars must be a list of variable names"):
        shell_env("true", harness_env_vars="HF_TOKEN").check_ready()


# -- item 6: processes that outlive their harness ----------------------------------------------------


def test_a_child_that_escapes_with_setsid_is_killed_at_the_wall_limit(smol_template, tmp_path) -> None:
    pid_file = tmp_path / "escaped.pid"
    # the escaped child holds stdout open and sleeps; the harness itself hangs too
    script = f"setsid sh -c 'echo $$ > {pid_file}; exec sleep 30' & sleep 30"
    started = time.monotonic()
    record = rollout(engine(smol_template, {"": []}, deadline_s=20.0), shell_env(script, timeout_s=2.0))
    took_s = time.monotonic() - started
    assert record["failure_kind"] == "timeout" and "did not finish within 2 s" in record["failure_reason"]
    assert took_s < 8.0, f"the 2 s wall limit took {took_s:.1f} s"
    assert pid_file.exists() and wait_gone(int(pid_file.read_text())), "the setsid child outlived the run"


def test_a_daemon_started_by_a_successful_harness_does_not_outlive_the_run(smol_template, turn, tmp_path) -> None:
    pid_file = tmp_path / "daemon.pid"
    # a double fork into a new session, with its output closed: nothing ties it to the harness but ancestry
    daemon = f"setsid sh -c 'sh -c \"echo \\$\\$ > {pid_file}; exec sleep 30\" & ' </dev/null >/dev/null 2>&1"
    script = f'{daemon}; while [ ! -s {pid_file} ]; do sleep 0.05; done; exec "$0" -c "$1"'
    record = rollout(engine(smol_template, {"": [turn("42")]}), shell_env(script))
    assert record["failure_kind"] is None and record["reward"] == 1.0, record["failure_reason"]
    assert wait_gone(int(pid_file.read_text())), "the daemon outlived the run"


def test_a_successful_harness_whose_background_child_keeps_stdout_open_is_scored(smol_template, turn, tmp_path) -> None:
    pid_file = tmp_path / "server.pid"
    script = f'sh -c "echo \\$\\$ > {pid_file}; exec sleep 30" & "$0" -c "$1"'  # `server & agent`
    started = time.monotonic()
    record = rollout(engine(smol_template, {"": [turn("42")]}), shell_env(script, timeout_s=6.0))
    took_s = time.monotonic() - started
    assert record["failure_kind"] is None and record["reward"] == 1.0, record["failure_reason"]
    assert record["metrics"]["verify"]["harness_exit_code"] == 0 and record["metrics"]["verify"]["stdout_tail"].strip() == "42"
    assert took_s < 6.0, f"the run waited {took_s:.1f} s for the background child's output to close"
    assert wait_gone(int(pid_file.read_text())), "the background child outlived the run"


KILLED_TRAINER = """
import asyncio, os, sys
from gym_bridge.capture.harness import run_command

script = "setsid sh -c 'echo $$ > " + sys.argv[1] + "; exec sleep 30' & sleep 30"
asyncio.run(run_command(["sh", "-c", script], env={"PATH": os.environ["PATH"]}, stdin=b"", timeout_s=60, stop=asyncio.Event()))
"""


def test_a_killed_trainer_leaves_no_harness_process_behind(tmp_path) -> None:
    import subprocess

    pid_file = tmp_path / "escaped.pid"
    trainer = subprocess.Popen([sys.executable, "-c", KILLED_TRAINER, str(pid_file)], env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    try:
        give_up = time.monotonic() + 20
        while not (pid_file.exists() and pid_file.read_text().strip()):
            assert time.monotonic() < give_up and trainer.poll() is None, "the harness never started"
            time.sleep(0.05)
    finally:
        trainer.kill()  # kill -9: no cleanup of its own runs
        trainer.wait()
    assert wait_gone(int(pid_file.read_text()), within_s=5.0), "the setsid child outlived its killed trainer"


# -- item 7: writing the task is bounded too ---------------------------------------------------------


def big_row() -> dict:
    row = example_row()
    row["responses_create_params"]["input"][1]["content"] += " " + "padding " * 40_000  # ~320 KB, past any pipe buffer
    return row


def test_a_large_task_to_a_harness_that_never_reads_stdin_is_bounded_by_the_wall_limit(smol_template) -> None:
    started = time.monotonic()
    record = rollout(engine(smol_template, {"": []}, deadline_s=20.0), shell_env("exec sleep 30", timeout_s=2.0), big_row())
    took_s = time.monotonic() - started
    assert record["failure_kind"] == "timeout" and "did not finish within 2 s" in record["failure_reason"]
    assert took_s < 8.0, f"the 2 s wall limit took {took_s:.1f} s"


def test_a_large_task_read_from_the_file_works_without_reading_stdin(smol_template, turn) -> None:
    record = rollout(engine(smol_template, {"": [turn("42")]}), shell_env('exec "$0" -c "$1"', timeout_s=15.0), big_row())
    assert record["failure_kind"] is None and record["reward"] == 1.0, record["failure_reason"]


def test_the_same_holds_on_uvloop_which_eval_runs_on(tmp_path) -> None:
    uvloop = pytest.importorskip("uvloop")
    from gym_bridge.capture.harness import run_command

    pid_file = tmp_path / "escaped.pid"
    env = {"PATH": os.environ["PATH"]}

    async def both() -> tuple:
        done = await run_command(["sh", "-c", "sleep 30 & echo done"], env=env, stdin=b"x" * 300_000, timeout_s=10, stop=asyncio.Event())
        hung = await run_command(["sh", "-c", f"setsid sh -c 'echo $$ > {pid_file}; exec sleep 30' & exec sleep 30"], env=env,
                                 stdin=b"x" * 300_000, timeout_s=1.5, stop=asyncio.Event())
        return done, hung

    started = time.monotonic()
    done, hung = uvloop.run(both())
    assert (done.exit_code, done.stdout_tail.strip(), done.timed_out) == (0, "done", False)
    assert hung.timed_out and time.monotonic() - started < 8.0
    assert wait_gone(int(pid_file.read_text()))
