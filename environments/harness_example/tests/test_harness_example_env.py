"""harness_example: the verifier on known-right and known-wrong answers, and the agent script run
for real against the capture endpoint (scripted policy)."""

from __future__ import annotations

import asyncio

from environments.harness_example import HarnessExampleEnvironment
from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.policy import SamplingParams, ScriptedPolicy
from gym_bridge.core.task import load_tasks

TASKS = load_tasks(HarnessExampleEnvironment.example_data)  # type: ignore[arg-type]


def test_score_reads_the_number_in_the_answer() -> None:
    env = HarnessExampleEnvironment()
    assert TASKS[0].get("expected_answer") == "42"
    assert env.score(TASKS[0], "12 + 30 = 42.").reward == 1.0
    assert env.score(TASKS[0], "It is 420").reward == 0.0
    assert env.score(TASKS[0], "").reward == 0.0


def test_the_agent_script_answers_through_the_endpoint(smol_template, turn) -> None:
    policy = ScriptedPolicy({"": [turn('<tool_call>\n{"name": "multiply", "arguments": {"a": 9, "b": 9}}\n</tool_call>'), turn("81")]})
    engine = Engine(policy, smol_template, EngineConfig(sampling=SamplingParams(max_new_tokens=64), limits=Limits(), template_check="off"))
    record = asyncio.run(engine.rollout(TASKS[3], env_class=HarnessExampleEnvironment)).to_dict()
    assert record["failure_kind"] is None, record["failure_reason"]
    assert record["reward"] == 1.0 and record["metrics"]["tool_calls"] == 1
    assert '{"result": 81}' in smol_template.tokenizer.decode(policy.calls[1].prompt_ids)
