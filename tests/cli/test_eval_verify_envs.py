"""`gym-bridge eval / verify / envs` end to end: the embedded model for real rollouts, a tiny
local model where only the plumbing matters (resume after SIGKILL)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from gym_bridge.cli import main
from gym_bridge.core.rollout_file import read_records
from tests.support.invariants import assert_token_invariants


def test_envs_lists_the_bundled_environments(capsys):
    assert main(["envs"]) == 0
    out = capsys.readouterr().out
    for name in ("weather", "multi_step", "math"):
        assert name in out
    assert "example.jsonl" in out


@pytest.mark.slow  # about 25 s; by default: eval of the embedded model via serve-model (serve/test_eval_over_http.py), verify (view/test_atif.py)
def test_eval_on_the_embedded_model_then_verify(tmp_path, capsys):
    output = tmp_path / "rollouts.jsonl"
    code = main(["eval", "--env", "weather", "--env", "multi_step", "--env", "math", "--limit", "2",
                 "--max-new-tokens", "64", "--max-turns", "3", "--seed", "0", "--no-progress", "--output", str(output)])
    printed = capsys.readouterr().out
    records = read_records(output)
    assert code == 0, printed
    assert len(records) == 6
    assert {(r["env"], r["task_index"], r["repeat_index"]) for r in records} == {
        ("weather", 0, 0), ("weather", 1, 0), ("multi_step", 2, 0), ("multi_step", 3, 0), ("math", 4, 0), ("math", 5, 0)}
    for record in records:
        assert record["failure_kind"] is None, record["failure_reason"]
        assert sum(record["tokens"]["completion_mask"]) > 0  # the model really generated
        assert_token_invariants(record)
    metrics = json.loads((tmp_path / "rollouts.metrics.json").read_text())
    assert set(metrics["per_env"]) == {"weather", "multi_step", "math"}
    assert metrics["rollouts"] == 6 and metrics["tokens"]["model"] > 0
    for name in ("weather", "multi_step", "math", "ALL", "mean_reward", "pass@1"):
        assert name in printed

    assert "pass@k: share of tasks" in printed  # the table explains its columns

    rescored = tmp_path / "rescored.jsonl"
    assert main(["verify", "--data", str(output), "--output", str(rescored)]) == 0
    assert [r["reward"] for r in read_records(rescored)] == [r["reward"] for r in records]
    assert f"records: {rescored}" in capsys.readouterr().out  # verify says where it wrote


def test_eval_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for default in ("rollouts in flight at once (default: 32)", "0 is greedy (default: 0.7)", "0 is off (default: 0)",
                    "(default: out/gym_bridge_eval.jsonl)", "model calls per rollout at most (default: 8)"):
        assert default in text
    assert "(default: None)" not in text and "(default: [])" not in text


def test_unknown_environment_and_bad_rows_fail_before_generation(tmp_path, capsys):
    assert main(["eval", "--env", "nope", "--output", str(tmp_path / "o.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "unknown environment 'nope'" in err and "weather" in err

    data = tmp_path / "rows.jsonl"
    data.write_text('{"prompt": "hi", "environment": "math"}\n{"environment": "math"}\n')
    assert main(["eval", "--data", str(data), "--output", str(tmp_path / "o.jsonl")]) == 2
    assert f"{data}:2: responses_create_params.input: row has no input" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()


def test_failures_set_the_exit_code(tmp_path, tiny_model_dir, capsys):
    data = tmp_path / "rows.jsonl"
    rows = [{"prompt": "x", "environment": "tests.support.failing_env:AlwaysCrashes"}] * 2
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    args = ["eval", "--data", str(data), "--model", str(tiny_model_dir), "--max-new-tokens", "4",
            "--no-progress", "--output", str(tmp_path / "o.jsonl")]
    assert main(args) == 3  # its own exit code, not 1 (a crash): issue 9 item 12
    captured = capsys.readouterr()
    assert "failures: verifier=2" in captured.out and "2 of 2 rollouts failed" in captured.err
    assert main([*args, "--max-failure-fraction", "1.0", "--overwrite"]) == 0


@pytest.mark.slow  # about 20 s; by default: a killed run resumed in eval/test_kill_resume.py, torn lines below
def test_resume_after_sigkill_completes_every_rollout_exactly_once(tmp_path, tiny_model_dir):
    output = tmp_path / "rollouts.jsonl"
    args = [sys.executable, "-m", "gym_bridge.cli", "eval", "--env", "weather", "--num-repeats", "6",
            "--model", str(tiny_model_dir), "--max-new-tokens", "24", "--max-turns", "2", "--concurrency", "2",
            "--no-progress", "--output", str(output)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and (not output.exists() or len(read_records(output)) < 3):
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    partial = read_records(output)
    assert 3 <= len(partial) < 48, "the run was not killed mid-way"

    finished = subprocess.run([*args, "--resume"], env=env, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr
    records = read_records(output)
    keys = [(r["task_index"], r["repeat_index"]) for r in records]
    assert sorted(keys) == [(t, r) for t in range(8) for r in range(6)]  # 8 tasks x 6 repeats, each once
    kept = {(r["task_index"], r["repeat_index"]): r for r in partial}
    for record in records:  # what was finished before the kill was kept, not rerun
        key = (record["task_index"], record["repeat_index"])
        if key in kept:
            assert record["tokens"] == kept[key]["tokens"]


@pytest.mark.parametrize("torn", ['{"task_index": 0, "repe', ""])
def test_read_records_drops_only_a_torn_last_line(tmp_path, torn):
    path = tmp_path / "r.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n' + torn)
    assert read_records(path) == [{"a": 1}, {"a": 2}]


def test_eval_takes_the_parser_options(tmp_path, tiny_model_dir, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--help"])
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    for name in ("--tool-parser", "--reasoning-parser", "--chat-template-kwargs", "--template-check", "phi4_mini_json", "openai_gptoss"):
        assert name in help_text
    with pytest.raises(SystemExit):
        main(["eval", "--chat-template-kwargs", "[1]"])
    assert "must be a JSON object" in capsys.readouterr().err
    output = tmp_path / "run.jsonl"
    assert main(["eval", "--env", "weather", "--limit", "1", "--model", str(tiny_model_dir), "--max-new-tokens", "4",
                 "--tool-parser", "mistral", "--reasoning-parser", "none", "--chat-template-kwargs", '{"unused": 1}',
                 "--no-progress", "--output", str(output)]) == 0
    metrics = json.loads(output.with_suffix(".metrics.json").read_text())
    assert metrics["parse_errors"] == 0 and "unparsed_tool_calls" in metrics
    assert all("parse_errors" in row["metrics"] for row in read_records(output))
