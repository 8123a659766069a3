"""The environment session: setup, tool calls as the model reads them, verify and close, with the tools offered
growing mid-episode as a loop offers more (BFCL's held-out functions)."""

from __future__ import annotations

import asyncio
import json

from gym_bridge.core.environment import Environment, VerifyResult, tool
from gym_bridge.core.session import EnvironmentSession, few_values
from gym_bridge.core.task import parse_task
from gym_bridge.core.turn import ToolCall

closed: list[str] = []


class TwoTools(Environment):
    name = "two_tools_for_session_test"

    def setup(self, task):
        self.total = 0

    @tool
    def add(self, n: int) -> dict:
        """Add n.

        Args:
            n: How much.
        """
        self.total += n
        return {"total": self.total}

    @tool
    def reset(self) -> str:
        """Start again from 0."""
        self.total = 0
        return "reset"

    def verify(self, task, output):
        return VerifyResult(reward=float(self.total == 5))

    def close(self):
        closed.append("closed")


def test_a_session_runs_the_offered_tools_and_a_tool_offered_later_once_it_is_offered():
    schemas = {spec.name: spec.schema for spec in TwoTools.tool_specs().values()}
    session = EnvironmentSession(TwoTools, tools=(schemas["add"],))  # `reset` is held out at the start
    task = parse_task({"prompt": "add to 5", "environment": "weather"}, index=0)
    closed.clear()

    async def episode() -> list[str]:
        await session.setup(task)
        outputs = [await session.call_tool(ToolCall(name="add", arguments=json.dumps({"n": 5})))]
        outputs.append(await session.call_tool(ToolCall(name="reset", arguments="{}")))
        session.offer([schemas["reset"]])
        outputs.append(await session.call_tool(ToolCall(name="reset", arguments="{}")))
        outputs.append(await session.call_tool(ToolCall(name="add", arguments="{}", error="not JSON")))
        result = await session.verify(task, [])
        assert result.reward == 0.0  # reset ran: the total is 0 again
        assert await session.close() is None
        return outputs

    outputs = asyncio.run(episode())
    assert outputs[0] == json.dumps({"total": 5})
    assert outputs[1] == json.dumps({"error": "unknown tool 'reset'; available tools: ['add']"})
    assert outputs[2] == "reset"
    assert outputs[3] == json.dumps({"error": "malformed tool call: not JSON"})
    assert closed == ["closed"]


def test_few_values_counts_every_container_and_scalar_and_refuses_a_long_string():
    """A tool result is encoded on the event loop only when `few_values` says it is small: each container, key and
    value counts once, and one string over the budget is enough to send it to a worker thread."""
    value = {"a": [1, 2, {"b": None}], "c": "xyz"}  # dict, 2 keys, the list, 1, 2, the inner dict, its key and value, "xyz"
    assert few_values(value, 10) and not few_values(value, 9)
    assert few_values("x" * 5, 5) and not few_values("x" * 6, 5)
    assert not few_values({"k": ["x" * 6]}, 5)  # a long string deep inside
    assert not few_values([[0] * 3] * 3, 12) and few_values([[0] * 3] * 3, 13)  # shared lists count each time they appear
    assert few_values(7, 1) and few_values((), 1) and not few_values([1], 1)
