"""Item 4 of "seeing rollouts": the TRL rollout function logs tool-call metrics and the completions-table
columns, warns once when an environment's rollouts call no tool, and writes its records with the step."""

from __future__ import annotations

import logging

from gym_bridge.trl._rollout import make_rollout
from gym_bridge.trl._rewards import env_reward, reward_metrics
from gym_bridge.trl._dataset import load_dataset
from gym_bridge.core.health import HealthSettings
from gym_bridge.core.policy import ScriptedPolicy
from gym_bridge.core.rollout_file import read_records
from tests.trl.test_rollout import Trainer

ROWS = [{"responses_create_params": {"input": "Weather in Oslo?"}, "environment": "weather", "case": "view-logging"}]


def test_reward_metrics_log_tool_calls():
    metrics = reward_metrics([1.0, 0.0, 0.0], env_names=["weather", "weather", "math"], reward_components=[{}] * 3,
                             failure_kinds=[None] * 3, tool_calls=[2, 0, 0])
    assert metrics["gym_bridge/tool_calls"] == 2 / 3  # (2 + 0 + 0) / 3 rollouts
    assert metrics["gym_bridge/weather/tool_call_rate"] == 0.5 and metrics["gym_bridge/math/tool_call_rate"] == 0.0


def test_env_reward_adds_table_columns():
    extra: dict = {}
    env_reward(["p"] * 2, ["c"] * 2, env_reward=[1.0, 0.0], env_name=["weather"] * 2, num_turns=[2, 1], tool_calls=[1, 0],
               log_metric=lambda *_: None, log_extra=extra.__setitem__)
    assert extra["tool_calls"] == [1, 0] and extra["num_turns"] == [2, 1] and extra["env_name"] == ["weather", "weather"]


def test_trl_rollout_alarms_once_and_writes_records_with_the_step(tmp_path, smol_tokenizer, turn, caplog):
    dataset = load_dataset(ROWS)
    path = tmp_path / "train_rollouts.jsonl"
    rollout = make_rollout(policy=ScriptedPolicy({"": [turn("It is sunny.")]}), records_path=str(path),
                           health=HealthSettings(no_tool_call_after=2))
    trainer = Trainer(smol_tokenizer, dataset=dataset)
    prompts = [prompt for prompt in dataset["prompt"] for _ in range(2)]
    with caplog.at_level(logging.WARNING, logger="gym_bridge.health"):
        for step in (0, 1):
            trainer.state = type("State", (), {"global_step": step})()
            rollout(prompts, trainer)
    alarms = [record.getMessage() for record in caplog.records if "TOOL-CALL ALARM" in record.getMessage()]
    assert len(alarms) == 1 and "'weather' offers tools, but none of its first 2 rollouts called one" in alarms[0]
    records = read_records(path)
    assert [record["metrics"]["train_step"] for record in records] == [0, 0, 1, 1] and {record["env"] for record in records} == {"weather"}


def test_verl_reward_extra_info_carries_tool_call_health(smol_template, turn):
    import asyncio

    import pytest

    pytest.importorskip("verl.experimental.agent_loop", reason="needs the verl extra: pip install 'gym-bridge[verl]'")
    from gym_bridge.verl._agent_loop import REWARD_EXTRA_KEYS, VerlServerPolicy, to_agent_loop_output
    from gym_bridge.core.engine import Engine, EngineConfig
    from gym_bridge.core.task import parse_task

    bad_call = turn("<tool_call>\n{get_weather: Oslo}\n</tool_call>")
    engine = Engine(ScriptedPolicy({"": [bad_call, turn("Cold.")]}), smol_template, EngineConfig())
    record = asyncio.run(engine.rollout(parse_task(ROWS[0], index=0), 0))
    policy = VerlServerPolicy(None, {}, eos_token_ids=sorted(smol_template.eos_token_ids), prompt_length=4096)
    info = to_agent_loop_output(record, policy=policy, prompt_length=4096, response_length=512).extra_fields["reward_extra_info"]
    assert tuple(info) == REWARD_EXTRA_KEYS
    assert info["gym_bridge_parse_errors"] == 1 and info["gym_bridge_tool_calls"] == 1 and info["gym_bridge_no_answer"] == 0.0
