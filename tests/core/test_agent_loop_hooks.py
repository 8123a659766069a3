"""The default loop's hooks for environments: `Environment.episode_ended` ends a rollout after the tool calls of the
turn that ended the episode, through the real engine with a scripted policy."""

import asyncio
import json

from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.environment import Environment, VerifyResult, tool
from gym_bridge.core.policy import ScriptedPolicy
from gym_bridge.core.registry import register
from gym_bridge.core.task import parse_task
from tests.support.invariants import assert_token_invariants
from tests.support.lab import call


@register
class Countdown(Environment):
    name = "countdown_for_loop_hook_test"

    def setup(self, task):
        self.left = int(task.get("steps", 2))

    @tool
    def step(self) -> dict:
        """Take one step of the countdown."""
        self.left -= 1
        return {"left": self.left}

    def episode_ended(self) -> bool:
        return self.left <= 0

    def verify(self, task, output):
        return VerifyResult(reward=1.0 if self.left <= 0 else 0.0)


def run(template, script, steps):
    engine = Engine(ScriptedPolicy(script), template, EngineConfig())
    row = parse_task({"prompt": "Count down.", "environment": Countdown.name, "steps": steps}, index=0)

    async def collect():
        return [record async for record in engine.stream([row])]

    [record] = asyncio.run(collect())
    return record


def test_the_environment_ends_the_episode_after_the_tool_calls_of_that_turn(smol_template, turn):
    script = {"": [turn(call(name="step")), turn(call(name="step")), turn(call(name="step")), turn("still here")]}
    record = run(smol_template, script, steps=2)
    assert (record.finish_reason, record.turns, record.tool_calls, record.reward) == ("answer", 2, 2, 1.0)
    outputs = [json.loads(item["output"]) for item in record.output if item["type"] == "function_call_output"]
    assert outputs == [{"left": 1}, {"left": 0}]
    assert_token_invariants(record.to_dict())


def test_by_default_the_episode_goes_on_until_the_model_answers(smol_template, turn):
    assert Environment().episode_ended() is False
    script = {"": [turn(call(name="step")), turn("done")]}
    record = run(smol_template, script, steps=5)
    assert (record.finish_reason, record.turns, record.tool_calls, record.reward) == ("answer", 2, 1, 0.0)
