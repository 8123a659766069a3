"""`gym-bridge eval` / `verify` against hostile input and misbehaving environments (issue 9).

Each test names the numbered item of issue 9 it pins. Subprocess tests use the tiny local model
(a randomly initialised 2-layer Llama) and are bounded by timeouts.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gym_bridge.core.metrics import format_table

from gym_bridge.cli import build_parser, main
from gym_bridge.cli.common import trust_settings
from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.errors import DataError, UnknownEnvironmentError
from gym_bridge.core.policy import ScriptedPolicy
from gym_bridge.core.registry import get_environment
from gym_bridge.core.rollout_file import input_row, prepare_resume, read_records
from gym_bridge.core.task import load_tasks
from gym_bridge.core.trust import TrustSettings
from gym_bridge.eval.run import run_eval, select_tasks

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def eval_command(data: Path, output: Path, model: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "gym_bridge.cli", "eval", "--data", str(data), "--model", str(model),
            "--max-new-tokens", "4", "--no-progress", "--output", str(output), *extra]


# -- item 2: the process always exits; Ctrl-C stops it ----------------------------------------


def test_eval_exits_after_its_summary_although_a_verifier_is_stuck(tmp_path, tiny_model_dir):
    """Item 2: a sync verifier stuck for an hour times out, its record is written, and `eval`
    exits right after printing the summary (interpreter shutdown no longer joins the thread)."""
    data = write_rows(tmp_path / "rows.jsonl", [{"prompt": "x", "environment": "tests.support.failing_env:HangsInVerify"}] * 2)
    started = time.monotonic()
    done = subprocess.run(eval_command(data, tmp_path / "out.jsonl", tiny_model_dir, "--max-failure-fraction", "1"),
                          env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "failures: verifier=2" in done.stdout
    assert time.monotonic() - started < 60
    assert [r["failure_reason"] for r in read_records(tmp_path / "out.jsonl")] == ["verify did not return within 0.2 s"] * 2


def test_ctrl_c_stops_eval_while_environment_code_is_stuck(tmp_path, tiny_model_dir):
    """Items 2 and 3: the user's Ctrl-C stops the run (exit 130, a hint to --resume) even while a
    setup call is stuck in a thread with an hour-long timeout; it is not swallowed as a rollout failure."""
    data = write_rows(tmp_path / "rows.jsonl", [{"prompt": "x", "environment": "tests.support.failing_env:HangsInSetup"}])
    output = tmp_path / "out.jsonl"
    process = subprocess.Popen(eval_command(data, output, tiny_model_dir), env=ENV, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while not output.exists() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        assert output.exists(), "the run did not start"
        time.sleep(0.5)  # the rollout is inside setup now
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 130, stderr
    assert f"interrupted: finished rollouts are in {output}; rerun with --resume" in stderr


def test_a_segfault_in_environment_code_says_where(tmp_path, tiny_model_dir):
    """Item 5: without isolation a segfaulting environment ends the process (docs/concepts/failures.md states
    this boundary), but with a traceback naming the environment's code, not silently."""
    data = write_rows(tmp_path / "rows.jsonl", [{"prompt": "x", "environment": "tests.support.failing_env:SegfaultsInSetup"}])
    done = subprocess.run(eval_command(data, tmp_path / "out.jsonl", tiny_model_dir), env=ENV, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == -signal.SIGSEGV
    assert "Fatal Python error: Segmentation fault" in done.stderr
    assert "failing_env.py" in done.stderr and "in setup" in done.stderr


# -- item 6: bad data files are file:line errors ----------------------------------------------


def test_invalid_utf8_is_a_file_line_error(tmp_path, capsys):
    """Item 6: a data file with a byte that is not UTF-8 names the file and line, no traceback."""
    data = tmp_path / "rows.jsonl"
    data.write_bytes(b'{"prompt": "fine", "environment": "math"}\n{"prompt": "caf\xe9", "environment": "math"}\n')
    assert main(["eval", "--data", str(data), "--output", str(tmp_path / "o.jsonl")]) == 2
    assert f"{data}:2: invalid UTF-8 (byte 0xe9 at column 16)" in capsys.readouterr().err
    broken = tmp_path / "records.jsonl"
    broken.write_bytes(b'{"a": "\xff"}\n{"a": 1}\n')
    with pytest.raises(DataError, match="records.jsonl:1"):
        read_records(broken)


@pytest.mark.parametrize(
    ("name", "message"),
    [("os:system", "agent_ref.name: 'os:system' names <built-in function system> (builtin_function_or_method), "
                   "not a gym_bridge Environment subclass"),
     ("json:JSONDecoder", "agent_ref.name: 'json:JSONDecoder' names <class 'json.decoder.JSONDecoder'> (type), not a gym_bridge"),
     ("tests.no_such_module:Env", "agent_ref.name: cannot import environment module 'tests.no_such_module'")],
)
def test_a_module_path_that_is_not_an_environment_is_a_file_line_field_error(tmp_path, capsys, name, message):
    """Item 6: `agent_ref.name: "os:system"` (a module attribute that is not an Environment)."""
    data = write_rows(tmp_path / "rows.jsonl", [{"prompt": "x", "agent_ref": {"type": "responses_api_agents", "name": name}}])
    assert main(["eval", "--data", str(data), "--output", str(tmp_path / "o.jsonl")]) == 2
    err = capsys.readouterr().err
    assert f"{data}:1: {message}" in err and "Traceback" not in err


# -- item 7: a row field named like a record field -------------------------------------------


@pytest.mark.parametrize("field", ["metrics", "env", "reward", "tokens", "response", "task_index", "env_path"])
def test_a_row_field_named_like_a_record_field_is_rejected_at_load(tmp_path, field):
    """Item 7: the record would overwrite it; the row is refused at load with file:line: field."""
    data = write_rows(tmp_path / "rows.jsonl", [{"prompt": "x", "environment": "math"},
                                                {"prompt": "y", "environment": "math", field: {"mine": 1}}])
    with pytest.raises(DataError, match=rf"rows.jsonl:2: {field}: '{field}' is a field gym_bridge adds to rollout records"):
        load_tasks(data)


def test_rows_round_trip_through_records_and_resume(tmp_path, smol_template, turn):
    """Item 7: every field of an accepted row survives in its record, so `--resume` recognises it."""
    rows = [{"prompt": "x", "environment": "tests.support.failing_env:AlwaysRight", "expected_answer": "4",
             "verifier_metadata": {"metrics": [1], "reward": 2}, "id": i} for i in range(3)]
    data = write_rows(tmp_path / "rows.jsonl", rows)
    tasks = select_tasks(data_paths=[data])
    engine = Engine(ScriptedPolicy({"": [turn("4")]}), smol_template, EngineConfig())
    output = tmp_path / "out.jsonl"
    asyncio.run(run_eval(engine, tasks, output=output))
    assert {record["task_index"]: input_row(record) for record in read_records(output)} == dict(enumerate(rows))
    assert prepare_resume(output, tasks) == {(0, 0), (1, 0), (2, 0)}


def test_throughput_after_a_resume_counts_only_this_runs_rollouts(tmp_path, smol_template, turn):
    rows = [{"prompt": "x", "environment": "tests.support.failing_env:AlwaysRight", "expected_answer": "4", "id": i} for i in range(4)]
    tasks = select_tasks(data_paths=[write_rows(tmp_path / "rows.jsonl", rows)])
    engine = Engine(ScriptedPolicy({"": [turn("4")]}), smol_template, EngineConfig())
    output = tmp_path / "out.jsonl"
    first = asyncio.run(run_eval(engine, tasks[:3], output=output))
    assert first.summary["throughput"]["rollouts"] == 3
    resumed = asyncio.run(run_eval(engine, tasks, output=output, resume=True))
    assert resumed.summary["rollouts"] == 4 and resumed.summary["throughput"]["rollouts"] == 1
    per_rollout = first.summary["tokens"]["model"] / 3
    assert resumed.summary["throughput"]["model_tokens"] == per_rollout
    assert "this run's 1 rollouts" in format_table(resumed.summary)


# -- item 8: one writer per --output ---------------------------------------------------------


def test_a_second_run_on_the_same_output_is_refused_at_start(tmp_path, capsys):
    """Item 8: while one process writes `--output`, another `eval` on it exits 2 at once, before
    loading a model or touching the file."""
    output = tmp_path / "out.jsonl"
    output.write_text('{"keep": true}\n')
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom gym_bridge.core.rollout_file import locked_output\n"
         f"with locked_output({str(output)!r}):\n    print('locked', flush=True)\n    time.sleep(60)"],
        env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"  # type: ignore[union-attr]
        started = time.monotonic()
        assert main(["eval", "--env", "weather", "--output", str(output)]) == 2
        assert time.monotonic() - started < 5
        err = capsys.readouterr().err
        assert f"{output} is being written by another gym-bridge run (pid {holder.pid}" in err
        assert output.read_text() == '{"keep": true}\n'
    finally:
        holder.kill()
        holder.wait()


# -- item 9: verify finds environments named by module path ----------------------------------


def test_verify_rescores_environments_loaded_by_module_path(tmp_path, smol_template, turn):
    """Item 9: records carry `env_path`, so a fresh `gym-bridge verify` process finds an
    environment that was named by module path (here only on the eval command line)."""
    data = write_rows(tmp_path / "rows.jsonl", [{"prompt": "x"}, {"prompt": "y"}])
    tasks = select_tasks(env_names=["tests.support.failing_env:AlwaysRight"], data_paths=[data])
    engine = Engine(ScriptedPolicy({"": [turn("sure")]}), smol_template, EngineConfig())
    output = tmp_path / "out.jsonl"
    asyncio.run(run_eval(engine, tasks, output=output))
    records = read_records(output)
    assert [(r["env"], r["env_path"]) for r in records] == [("always_right", "tests.support.failing_env:AlwaysRight")] * 2
    for record in records:
        record["reward"] = 0.0  # re-scoring must recompute it
    write_rows(output, records)

    rescored = tmp_path / "rescored.jsonl"
    command = [sys.executable, "-m", "gym_bridge.cli", "verify", "--data", str(output), "--output", str(rescored)]
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [r["reward"] for r in read_records(rescored)] == [1.0, 1.0]

    refused = subprocess.run([*command, "--no-module-paths"], env=ENV, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert f"{output}:1: unknown environment 'always_right'" in refused.stderr
    assert "module paths are turned off (--no-module-paths)" in refused.stderr


# -- item 12: exit codes ---------------------------------------------------------------------


def test_exit_codes_are_documented_in_eval_help(capsys):
    """Item 12 (the code itself is pinned in test_eval_verify_envs.py::test_failures_set_the_exit_code)."""
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    out = capsys.readouterr().out
    for line in ("exit codes:", "  0 ", "  1 ", "  2 ", "  3    the run finished, but more than --max-failure-fraction", "  130 "):
        assert line in out


# -- item 13: module paths in data are code ---------------------------------------------------


def test_module_paths_in_data_can_be_refused_or_limited(tmp_path, capsys):
    """Item 13: `--no-module-paths` refuses a row naming a module; `--allow-module` admits only
    its prefixes; a module path given with `--env` stays trusted."""
    data = write_rows(tmp_path / "rows.jsonl", [{"prompt": "x", "environment": "tests.support.failing_env:AlwaysRight"}])
    out = str(tmp_path / "o.jsonl")
    assert main(["eval", "--data", str(data), "--no-module-paths", "--output", out]) == 2
    assert f"{data}:1: environment: environment 'tests.support.failing_env:AlwaysRight' is a module path, and module paths are turned off" \
        in capsys.readouterr().err
    assert main(["eval", "--data", str(data), "--allow-module", "my_company.envs", "--output", out]) == 2
    assert "environment module 'tests.support.failing_env' is not under an allowed prefix (my_company.envs)" in capsys.readouterr().err

    assert select_tasks(data_paths=[data], trust=TrustSettings.limited_to(["tests"]))[0].env_name == "tests.support.failing_env:AlwaysRight"
    with pytest.raises(UnknownEnvironmentError, match="not under an allowed prefix"):  # a prefix of the name is not a package prefix
        get_environment("tests.support.failing_env:AlwaysRight", TrustSettings.limited_to(["tests.failing"]))
    none = TrustSettings.limited_to([])
    assert get_environment("weather", none).name == "weather"  # registered environments always route
    with pytest.raises(UnknownEnvironmentError, match="module paths are turned off"):
        get_environment("tests.support.failing_env:AlwaysRight", none)
    args = build_parser().parse_args(["eval", "--env", "tests.support.failing_env:AlwaysRight", "--no-module-paths"])
    trust = trust_settings(args)  # what `eval` passes down: the command line's own module path is trusted
    assert get_environment("tests.support.failing_env:AlwaysRight", trust).name == "always_right"
    with pytest.raises(UnknownEnvironmentError, match=r"'json' is not under an allowed prefix \(tests.support.failing_env\)"):
        get_environment("json:JSONDecoder", trust)
    # an --env-setting's NAME goes through the same trust: configuring a module path does not import it past it
    from gym_bridge.cli.eval_engine import _apply_env_options

    with pytest.raises(UnknownEnvironmentError, match="module paths are turned off"):
        _apply_env_options(["tests.support.failing_env:AlwaysRight.tool_timeout_s=5"], [], none)
