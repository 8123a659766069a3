"""`gym-bridge eval` and `data validate` refuse bad input before any rollout and before touching
--output (issue 19, items 4 and 8): exit 2, file:line and field, no traceback, the old file intact."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

import environments.code as code_env
from gym_bridge.cli import main
from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.errors import GymBridgeError
from gym_bridge.core.policy import ScriptedPolicy
from gym_bridge.core.task import parse_task
from gym_bridge.eval.run import run_eval

KEPT = '{"keep": true}\n'


def refuse_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(code_env, "probe", lambda python: "bubblewrap is not installed (no `bwrap` on PATH)")


def test_a_refused_eval_leaves_an_existing_output_untouched(tmp_path: Path, capsys, monkeypatch) -> None:
    """Item 8: `--env code` without bubblewrap used to truncate --output before the refusal."""
    refuse_sandbox(monkeypatch)
    output = tmp_path / "out.jsonl"
    output.write_text(KEPT)
    started = time.monotonic()
    assert main(["eval", "--env", "code", "--limit", "1", "--no-progress", "--overwrite", "--output", str(output)]) == 2
    assert time.monotonic() - started < 10  # refused before loading a model
    assert "refuses to run untrusted code without a sandbox" in capsys.readouterr().err
    assert output.read_text() == KEPT


def test_run_eval_checks_readiness_before_opening_the_output(tmp_path: Path, smol_template, monkeypatch) -> None:
    refuse_sandbox(monkeypatch)
    output = tmp_path / "out.jsonl"
    output.write_text(KEPT)
    task = parse_task({"prompt": "x", "verifier_metadata": {"unit_tests": {"inputs": ["1"], "outputs": ["1"]}}}, index=0, default_env="code")
    policy = ScriptedPolicy({"": []})
    with pytest.raises(GymBridgeError, match="bubblewrap is not installed"):
        asyncio.run(run_eval(Engine(policy, smol_template, EngineConfig()), [task], output=output))
    assert output.read_text() == KEPT and policy.calls == []


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"prompt": "x", "environment": "math", "hash_id": 2**127}, "hash_id: an integer beyond 64 bits"),
        ({"prompt": "x", "environment": "math", "meta": json.loads("[" * 300 + "]" * 300)}, "meta[0][0]"),
    ],
)
def test_rows_a_record_cannot_hold_are_refused_by_eval_and_validate(tmp_path: Path, capsys, row: dict, message: str) -> None:
    """Item 4: such rows passed `data validate` and eval's checks, ran, then crashed the record write (rc 1)."""
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"prompt": "fine", "environment": "math"}) + "\n" + json.dumps(row) + "\n")
    output = tmp_path / "out.jsonl"
    output.write_text(KEPT)
    assert main(["eval", "--data", str(data), "--max-new-tokens", "2", "--no-progress", "--overwrite", "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert f"{data}:2: {message}" in err and "Traceback" not in err
    assert output.read_text() == KEPT
    assert main(["data", "validate", str(data)]) == 1
    captured = capsys.readouterr()
    assert f"{data}:2: {message}" in captured.err and "1 problem(s)" in captured.out


def test_eval_refuses_an_output_that_is_its_data(tmp_path: Path, capsys) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"prompt": "x", "environment": "math"}) + "\n")
    before = data.read_text()
    assert main(["eval", "--data", str(data), "--no-progress", "--output", str(data)]) == 2
    assert f"--output {data} is also an input" in capsys.readouterr().err
    assert data.read_text() == before
