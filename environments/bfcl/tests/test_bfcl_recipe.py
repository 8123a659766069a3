"""`recipes/trl_grpo.py` trains a GRPO step on a BFCL multi-turn mix on the CPU (`slow`): real BFCL rows from the
installed package, the embedded model, the BFCL worker in `.venv-bfcl`, BFCL's own verdict as the reward."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from environments.bfcl.bridge import worker_python

REPO = Path(__file__).resolve().parents[3]
CONFIG = "recipes/configs/trl_grpo_bfcl_multi_turn_cpu.yaml"
MIX = {"multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param"}

pytestmark = pytest.mark.skipif(worker_python() is None, reason="BFCL runs in .venv-bfcl: make install-bfcl")


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_the_recipe_trains_a_step_on_bfcl_multi_turn_rollouts(tmp_path: Path) -> None:
    output = tmp_path / "run"
    command = [sys.executable, "recipes/trl_grpo.py", "--config", CONFIG, "--set", "grpo.max_steps=1",
               "--set", f"grpo.output_dir={output}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=3500)
    assert done.returncode == 0, done.stderr[-4000:]
    assert sorted(path.name for path in (output / "data").iterdir()) == sorted(f"bfcl.{task}.train.seed0.jsonl" for task in MIX)
    steps = [entry for entry in json.loads((output / "log_history.json").read_text()) if "loss" in entry]
    assert len(steps) == 1 and "gym_bridge/bfcl_multi_turn/reward" in steps[0] and steps[0]["gym_bridge/failed"] == 0.0
    records = [json.loads(line) for line in (output / "rollouts" / "run-1" / "rollouts.rank0.jsonl").read_text().splitlines()]
    assert len(records) == 2 and {record["agent_ref"]["name"] for record in records} == {"bfcl_multi_turn"}
    for record in records:  # scored by BFCL's multi-turn checker: its verdict, category and error type in the record
        verdict = record["metrics"]["verify"]
        assert record["failure_kind"] is None and record["bfcl"]["category"] in MIX
        assert verdict["bfcl_category"] == record["bfcl"]["category"] and record["reward"] == float(verdict["bfcl_valid"])
        assert record["metrics"]["train_step"] == 0
    assert steps[0]["gym_bridge/bfcl_multi_turn/reward"] == pytest.approx(sum(record["reward"] for record in records) / 2)
