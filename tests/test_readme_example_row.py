"""The docs' "Writing an environment" page (issue 28 item 15; the README's section until issue 29 moved it): its example
environment and data row, taken from the page as written, validate and score the row's known answer."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "writing-an-environment.md"


def _section() -> str:
    text = PAGE.read_text(encoding="utf-8")
    assert text.startswith("# Writing an environment\n")
    return text.split("\n## ", 1)[0]


def test_the_readme_example_row_validates_and_scores(tmp_path):
    section = _section()
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    row_text = re.search(r"```json\n(.*?)```", section, re.S).group(1).strip()
    row = json.loads(row_text)
    assert row["agent_ref"]["name"] == "inventory" and row["responses_create_params"]["input"] and "expected_answer" in row
    (tmp_path / "readme_inventory_env.py").write_text(code)
    (tmp_path / "rows.jsonl").write_text(row_text + "\n")
    rows = str(tmp_path / "rows.jsonl")
    # in a process of its own, as a user runs it: registering `inventory` here would outlive this test
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(PAGE.parents[1]), os.environ.get("PYTHONPATH", "")])}

    def gym_bridge(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "gym_bridge", *args], capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    assert "1 row (inventory 1): ok" in gym_bridge("data", "validate", rows, "--env", "readme_inventory_env:Inventory")
    out = gym_bridge("env", "check", "readme_inventory_env:Inventory", "--data", rows, "--call", 'count={"item": "apple"}')
    assert '"count": 3' in out and re.search(r"reward 1(\.0+)?\b", out), out
