"""Writing an environment (issue 19 item 17): a class named by module path routes rows by its `name`,
the current directory is importable, `python -m gym_bridge` works, `task["x"]` works, eval checks
`row_schema` as `data validate` does, and `gym-bridge env check` exercises tools and verify without a model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gym_bridge.core.errors import DataError, UnknownEnvironmentError
from gym_bridge.core.task import parse_task
from gym_bridge.eval.run import select_tasks

ROOT = Path(__file__).resolve().parents[2]
ORDER_ENV = textwrap.dedent('''
    from gym_bridge import Environment, Task, ToolError, VerifyResult, final_text, tool

    ORDERS = {"42": "shipped", "7": "lost"}


    class OrderStatus(Environment):
        name = "order_status"

        @tool
        def lookup(self, order_id: str) -> dict:
            """Look an order up.

            Args:
                order_id: The order's number.
            """
            if order_id == "boom":
                raise RuntimeError("database down")
            if order_id not in ORDERS:
                raise ToolError(f"no order {order_id}")
            return {"order_id": order_id, "status": ORDERS[order_id]}

        def verify(self, task: Task, output) -> VerifyResult:
            return VerifyResult(reward=float(task["expected_answer"] in final_text(output)))
''')


@pytest.fixture()
def author_dir(tmp_path, monkeypatch):
    """A folder as an author has it: order_env.py and rows.jsonl whose rows say agent_ref.name: order_status."""
    (tmp_path / "order_env.py").write_text(ORDER_ENV)
    rows = [{"responses_create_params": {"input": f"Where is order {n}?"}, "expected_answer": status, "agent_ref": {"name": "order_status"}}
            for n, status in (("42", "shipped"), ("7", "lost"))]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "order_env", raising=False)
    return tmp_path


def test_a_module_path_env_routes_rows_that_use_its_name(author_dir):
    tasks = select_tasks(env_names=["order_env:OrderStatus"], data_paths=[author_dir / "rows.jsonl"])
    assert [task.env_name for task in tasks] == ["order_status", "order_status"]


def test_a_typo_in_env_is_reported_even_when_rows_name_their_environment():
    weather_rows = ROOT / "environments" / "weather" / "data" / "example.jsonl"
    with pytest.raises(UnknownEnvironmentError, match="unknown environment 'wether'"):
        select_tasks(env_names=["wether"], data_paths=[weather_rows])


def test_eval_checks_the_row_schema_like_data_validate(tmp_path):
    row = {"responses_create_params": {"input": "What is 2 + 2?"}, "agent_ref": {"name": "arithmetic"}}  # no expected_answer
    (tmp_path / "rows.jsonl").write_text(json.dumps(row) + "\n" + json.dumps({**row, "expected_answer": "four"}) + "\n")
    with pytest.raises(DataError, match=r"rows.jsonl:1: expected_answer: Field required.*1 more problem") as caught:
        select_tasks(data_paths=[tmp_path / "rows.jsonl"])
    assert "arithmetic" in str(caught.value)


def test_task_is_subscriptable():
    task = parse_task({"prompt": "hi", "expected_answer": "4", "environment": "math"}, index=0, source="rows.jsonl:3")
    assert task["expected_answer"] == "4" and "expected_answer" in task and "nope" not in task
    with pytest.raises(KeyError, match="rows.jsonl:3 has no field 'x'; its fields: environment, expected_answer, prompt"):
        task["x"]


def _console_script(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """The `gym-bridge` script as pip installs it: its sys.path does not hold the current directory."""
    code = ("import os, sys\nsys.path[:] = [p for p in sys.path if p not in ('', os.getcwd())]\n"
            f"from gym_bridge.cli import main\nsys.argv = ['gym-bridge', *{args!r}]\nsys.exit(main())")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_console_script_imports_environments_from_the_current_directory(author_dir):
    done = _console_script(["data", "validate", "rows.jsonl", "--env", "order_env:OrderStatus"], author_dir)
    assert done.returncode == 0, done.stderr
    assert "2 rows (order_status 2): ok" in done.stdout


def test_env_check_runs_tools_and_verify_without_a_model(author_dir):
    """`python -m gym_bridge env check`: the prompt and tools shown, scripted calls on the row's session
    (a ToolError is what the model reads), the known answer scored above an empty one."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "gym_bridge", "env", "check", "order_env:OrderStatus", "--data", "rows.jsonl",
                           "--call", 'lookup={"order_id": "42"}', "--call", 'lookup={"order_id": "9"}', "--call", 'lookup={"id": 1}'],
                          cwd=author_dir, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "environment 'order_status' (order_env:OrderStatus); tools: lookup" in out
    assert "    user: Where is order 42?" in out and "    tool lookup(order_id: string): Look an order up." in out
    assert 'call lookup({"order_id": "42"}) -> {"order_id": "42", "status": "shipped"}' in out
    assert 'call lookup({"order_id": "9"}) -> {"error": "no order 9"}' in out
    assert 'call lookup({"id": 1}) -> {"error": "invalid arguments for lookup: order_id: Field required' in out
    assert "verify(answer 'shipped') -> reward 1" in out and "verify(empty answer) -> reward 0" in out
    assert "2 of 2 row(s) checked: ok" in out


def test_env_check_reports_a_crashing_tool_and_a_bad_row(author_dir):
    (author_dir / "bad.jsonl").write_text(json.dumps({"agent_ref": {"name": "order_status"}}) + "\n")
    done = _console_script(["env", "check", "order_env:OrderStatus", "--data", "bad.jsonl", "--data", "rows.jsonl",
                            "--call", 'lookup={"order_id": "boom"}', "--limit", "2"], author_dir)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "bad.jsonl:1\n  PROBLEM: responses_create_params.input: row has no input" in done.stdout
    assert "PROBLEM: tool 'lookup' raised RuntimeError: database down" in done.stdout
    assert "2 of 3 row(s) checked: 2 problem(s)" in done.stdout


def test_env_check_with_module_paths_off_still_trusts_its_own_argument(author_dir):
    done = _console_script(["env", "check", "order_env:OrderStatus", "--data", "rows.jsonl", "--no-module-paths", "--limit", "1",
                            "--answer", "shipped"], author_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verify(answer 'shipped') -> reward 1" in done.stdout
