"""What `gym-bridge eval` and `data validate` tell a new user (issue 28, item 18): a hint for an environment of
their own, parse-error lines that agree, an ETA that holds with fast and slow environments mixed, and alarms on
lines of their own above the progress bar."""

from __future__ import annotations

import heapq
import json
import os
import re
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from gym_bridge.cli import main
from gym_bridge.core.health import tool_call_health
from gym_bridge.core.metrics import format_table, summarize

ROOT = Path(__file__).resolve().parents[2]
ROW = {"responses_create_params": {"input": "How many metres is 2 km?"}, "agent_ref": {"type": "responses_api_agents", "name": "unitconv"},
       "expected_answer": "2000"}


def test_data_validate_suggests_a_module_path_for_an_unknown_environment(tmp_path, capsys, monkeypatch):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(ROW) + "\n")
    assert main(["data", "validate", str(rows)]) == 1
    err = capsys.readouterr().err
    assert "unknown environment 'unitconv'" in err and "pass --env my_package.my_module:MyEnvironment" in err
    # and the hint is right: with the module path, the same rows validate
    (tmp_path / "unitconv_env.py").write_text(textwrap.dedent('''
        from gym_bridge import Environment, VerifyResult

        class UnitConv(Environment):
            name = "unitconv"

            def verify(self, task, response):
                return VerifyResult(reward=float(task.row["expected_answer"] in response.text))
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["data", "validate", str(rows), "--env", "unitconv_env:UnitConv"]) == 0
    assert "1 row (unitconv 1): ok" in capsys.readouterr().out


def _record(env: str, **metrics: int) -> dict:
    return {"env": env, "task_index": 0, "repeat_index": 0, "reward": 0.0, "mask_sample": False, "failure_kind": None,
            "responses_create_params": {"input": "x", "tools": [{"type": "function", "name": "get_weather"}]},
            "metrics": {"turns": 1, "tool_calls": 0, "parse_errors": 0, "unparsed_tool_calls": 0, "finish_reason": "answer", **metrics}}


def test_the_health_line_and_the_syntax_line_count_the_same_calls():
    records = [_record("weather", unparsed_tool_calls=1) for _ in range(3)] + [_record("weather", tool_calls=1, parse_errors=1)]
    summary = summarize(records)
    summary["tool_call_health"] = tool_call_health(records)
    table = format_table(summary)
    assert "parse errors 100% (4 of 4 tool calls could not be parsed: 1 malformed, 3 in a syntax the parser does not read)" in table
    assert "tool-call syntax: 4 tool calls could not be parsed: 1 malformed, 3 in a syntax the parser does not read" in table
    assert "0 calls could not be parsed" not in table


def _simulate(order: list[str], latency_s: dict[str, float], concurrency: int) -> list[tuple[float, str, float]]:
    """(finish time, env, latency) of rollouts dispatched in `order`, `concurrency` at a time."""
    running: list[tuple[float, str]] = []
    finished = []
    now, queue = 0.0, list(order)
    while queue or running:
        while queue and len(running) < concurrency:
            env = queue.pop(0)
            heapq.heappush(running, (now + latency_s[env], env))
        now, env = heapq.heappop(running)
        finished.append((now, env, latency_s[env]))
    return finished


def test_the_eta_holds_with_fast_and_slow_environments_mixed():
    from gym_bridge.cli.eval import interleave_by_env
    from gym_bridge.eval.progress import Eta
    from gym_bridge.core.task import parse_task

    latency_s = {"weather": 0.5, "multi_step": 5.0}
    tasks = [parse_task({"prompt": "x"}, index=i, default_env=env) for i, env in enumerate(["weather"] * 40 + ["multi_step"] * 40)]
    order = [task.env_name for task in interleave_by_env(tasks)]
    assert order[:4] == ["weather", "multi_step", "weather", "multi_step"] and Counter(order) == Counter(t.env_name for t in tasks)
    for dispatch in (order, [task.env_name for task in tasks]):  # gym-bridge's order, and the file's
        finished = _simulate(dispatch, latency_s, concurrency=8)
        end_s = finished[-1][0]
        eta = Eta(dict(Counter(dispatch)), concurrency=8)
        for position, (now, env, latency) in enumerate(finished[:-8], start=1):
            eta.add(env, latency, at_s=now)
            if position >= 8 and dispatch is order and not eta.unseen():  # after the first wave and a rollout of each env, as shown
                assert eta.remaining_s(now_s=now) == pytest.approx(end_s - now, rel=0.35), (position, now)
                assert eta.remaining_s(now_s=now + 1) == pytest.approx(eta.remaining_s(now_s=now) - 1)  # it counts down
        if dispatch is order:
            assert not eta.unseen()
            continue
        # the file's order with tqdm's average rate (what the bar showed): about 5x short a quarter of the way in
        now = finished[19][0]
        average_rate_eta = now / 20 * 60
        assert (end_s - now) / average_rate_eta > 4


def test_an_alarm_gets_a_line_of_its_own_above_the_progress_bar(tmp_path, tiny_model_dir):
    """A real command line (no pytest log capture): the alarm used to be printed right after the bar's text."""
    command = [sys.executable, "-m", "gym_bridge.cli", "eval", "--env", "weather", "--limit", "3", "--model", str(tiny_model_dir),
               "--max-new-tokens", "2", "--no-tool-call-after", "1", "--concurrency", "1", "--output", str(tmp_path / "out.jsonl")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode in (0, 3), done.stderr
    lines = re.split(r"[\r\n]", done.stderr)
    alarms = [line for line in lines if "TOOL-CALL ALARM" in line]
    assert alarms and all(line.startswith("TOOL-CALL ALARM: environment 'weather' offers tools") for line in alarms), alarms
