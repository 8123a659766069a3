"""An eval run does its setup once (issue 29 item 6): the rows are routed once, each environment's readiness
is checked once, the output is locked once, and the summary comes from the records in memory (a fresh run reads
no rollout file; a resumed run reads it once, to keep its finished rollouts), while staying what the file holds."""

from __future__ import annotations

import contextlib
import json

import pytest

import gym_bridge.core.registry as registry
import gym_bridge.core.rollout_file as rollout_file
import gym_bridge.eval.run as evaluate
from gym_bridge import ScriptedChatPolicy, get_environment
from gym_bridge.cli import main
from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.errors import BackendAnswerError
from gym_bridge.core.metrics import summarize
from gym_bridge.core.health import tool_call_health

CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Seattle"}}</tool_call>'


@pytest.fixture
def counted(monkeypatch):
    """Counts of routing (per row), readiness checks, output locks and rollout-file reads during a `gym-bridge eval`
    on a scripted chat policy: 2 weather rows x 2 repeats, task 1's first repeat failing on the first run."""
    counts = {"routed": 0, "ready": 0, "locked": 0, "read": 0}
    route, lock, read = registry._route, rollout_file.locked_output, rollout_file.read_records

    def counting(key, real):
        def call(*args, **kwargs):
            counts[key] += 1
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(registry, "_route", counting("routed", route))
    weather = get_environment("weather")
    monkeypatch.setattr(weather, "check_ready", classmethod(lambda cls: counts.__setitem__("ready", counts["ready"] + 1)))
    for module in (rollout_file, evaluate):
        monkeypatch.setattr(module, "locked_output", contextlib.contextmanager(counting("locked", lock.__wrapped__)))
        monkeypatch.setattr(module, "read_records", counting("read", read))
    policies = iter([ScriptedChatPolicy({"1-0": [BackendAnswerError("down")], "": [CALL, "Cold."]}),
                     ScriptedChatPolicy({"": [CALL, "Cold."]})])

    async def build_engine(args, trust):
        return Engine(next(policies), None, EngineConfig(), trust=trust)

    monkeypatch.setattr("gym_bridge.cli.eval._build_engine", build_engine)
    return counts


def run_eval_cli(output, *extra):
    return main(["eval", "--env", "weather", "--limit", "2", "--num-repeats", "2", "--output", str(output), "--no-progress",
                 "--max-failure-fraction", "1", *extra])


def test_an_eval_run_routes_checks_and_locks_once_and_summarizes_from_memory(counted, tmp_path, capsys):
    output = tmp_path / "run.jsonl"
    assert run_eval_cli(output) == 0
    # 2 rows routed once each (today: 4 times), weather checked once (3), one lock (2), the file never read back (1)
    assert counted == {"routed": 2, "ready": 1, "locked": 1, "read": 0}
    summary = json.loads(evaluate.metrics_path_for(output).read_text())
    records = rollout_file.read_records(output)
    expected = summarize(records, num_repeats=2)
    assert {key: summary[key] for key in expected} == expected and summary["rollouts"] == 4 and summary["failed"] == 1
    assert summary["tool_call_health"] == json.loads(json.dumps(tool_call_health(records)))

    for key in counted:
        counted[key] = 0
    assert run_eval_cli(output, "--resume") == 0  # reruns the failed rollout only
    assert counted == {"routed": 2, "ready": 1, "locked": 1, "read": 1}  # the one read: the finished rollouts kept
    summary = json.loads(evaluate.metrics_path_for(output).read_text())
    records = rollout_file.read_records(output)
    expected = summarize(records, num_repeats=2)
    assert {key: summary[key] for key in expected} == expected and summary["rollouts"] == 4 and summary["failed"] == 0
    assert summary["throughput"]["rollouts"] == 1
