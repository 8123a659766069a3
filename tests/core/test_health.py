"""Tool-call health and its alarm, on rollouts the engine really ran (scripted policy, bundled environments)."""

from __future__ import annotations

import logging

import pytest

from gym_bridge.core.health import HealthSettings, ToolCallAlarm, model_family, tool_call_health
from gym_bridge.core.metrics import format_table
from gym_bridge.core.rollout_file import read_records
from tests.support.rollout_files import evaluate, multi_step_script


@pytest.mark.parametrize(("name", "family"), [
    ("SmolLM2-135M-Instruct (embedded)", "smollm2"),
    ("Qwen/Qwen3-8B", "qwen3"),
    ("/models/Llama-3.1-8B-Instruct/", "llama-3.1"),
    ("gpt-4o-mini", "gpt-4o-mini"),
    ("", "unknown"),
])
def test_model_family(name, family):
    assert model_family(name) == family


def test_alarm_fires_once_on_a_run_that_never_calls_a_tool(tmp_path, smol_template, turn, caplog):
    # weather offers get_weather; the scripted model answers every time without calling it
    with caplog.at_level(logging.WARNING, logger="gym_bridge.health"):
        result = evaluate(smol_template, [turn("It is probably sunny.")], env="weather", limit=5,
                          output=tmp_path / "w.jsonl", health=HealthSettings(no_tool_call_after=3))
    alarms = result.summary["alarms"]
    assert len(alarms) == 1 and "'weather' offers tools, but none of its first 3 rollouts called one" in alarms[0]
    assert sum("TOOL-CALL ALARM" in record.getMessage() for record in caplog.records) == 1  # once, not per rollout
    health = result.summary["tool_call_health"]["per_env"]["weather"]
    assert health["offers_tools"] and health["tool_call_rate"] == 0.0 and health["rollouts"] == 5
    table = format_table(result.summary)
    assert "ALARM: environment 'weather' offers tools" in table
    assert "tool calls [weather]: 0% of rollouts call a tool" in table


def test_alarm_stays_quiet_on_a_tool_calling_run(tmp_path, smol_template, turn, caplog):
    with caplog.at_level(logging.WARNING, logger="gym_bridge.health"):
        result = evaluate(smol_template, multi_step_script(turn), env="multi_step", limit=2,
                          output=tmp_path / "m.jsonl", health=HealthSettings(no_tool_call_after=1))
    assert result.summary["alarms"] == []
    assert not [record for record in caplog.records if "TOOL-CALL ALARM" in record.getMessage()]
    block = result.summary["tool_call_health"]["per_env"]["multi_step"]
    # 2 rollouts x 3 calls each, all parsed, each ending with an answer turn
    assert block["tool_call_rate"] == 1.0 and block["tool_calls_per_rollout"] == 3.0
    assert block["parse_error_rate"] == 0.0 and block["no_answer_rate"] == 0.0
    assert "ALARM" not in format_table(result.summary)


def test_parse_error_alarm(tmp_path, smol_template, turn):
    # each rollout: one call the parser cannot read (not JSON), then one good call, then an answer: 1 of 2 attempts unreadable
    script = [turn("<tool_call>\n{get_weather: Paris}\n</tool_call>"),
              turn('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'), turn("Cold.")]
    result = evaluate(smol_template, script, env="weather", limit=3, output=tmp_path / "p.jsonl",
                      health=HealthSettings(min_attempts=4, max_parse_error_rate=0.3))
    block = result.summary["tool_call_health"]["per_env"]["weather"]
    assert block["parse_error_rate"] == pytest.approx(0.5)
    assert len(result.summary["alarms"]) == 1 and "50% of 4 tool calls could not be parsed" in result.summary["alarms"][0]


def test_health_per_model_family_from_stored_records(mixed_file):
    health = tool_call_health(read_records(mixed_file))
    assert set(health["per_env"]) == {"multi_step", "weather"}
    family = health["per_model_family"]["smollm2"]
    assert family["rollouts"] == 5 and family["tool_call_rate"] == pytest.approx(2 / 5)


def test_no_alarm_for_an_environment_without_tools():
    alarm = ToolCallAlarm(HealthSettings(no_tool_call_after=1), tools_offered=lambda row: False)
    assert alarm.observe({"env": "chat", "metrics": {"tool_calls": 0, "finish_reason": "answer"}}) == []


def test_eval_refuses_bad_alarm_settings_at_parse_time(capsys):
    from gym_bridge.cli import main

    for argv in (["--no-tool-call-after", "-1"], ["--max-parse-error-rate", "1.5"]):
        with pytest.raises(SystemExit) as exit_info:
            main(["eval", "--env", "weather", *argv])
        assert exit_info.value.code == 2
    assert "argument --max-parse-error-rate: must be at least 0 and at most 1, got 1.5" in capsys.readouterr().err
