"""The `Lab` test environment: one tool with every failure mode (crash, hang, tool error, an
unserializable result) and a verifier that can crash or hang; tests of the engine and of records share it."""

import asyncio
import json
import time

from gym_bridge.core.environment import Environment, ToolError, VerifyResult, tool
from gym_bridge.core.registry import register
from gym_bridge.core.task import parse_task

CALL = '<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'
closed_sessions: list[str] = []


@register
class Lab(Environment):
    name = "lab_for_engine_test"
    tool_timeout_s = 0.5
    verify_timeout_s = 0.5

    def setup(self, task):
        self.mode = task.get("mode", "ok")
        self.calls = 0

    @tool
    def measure(self, sample: str) -> dict:
        """Measure a sample.

        Args:
            sample: Sample name.
        """
        self.calls += 1
        if sample == "crash":
            raise RuntimeError("instrument broke")
        if sample == "hang":
            time.sleep(5)
        if sample == "missing":
            raise ToolError("no such sample")
        if sample == "weird":
            return {"value": object()}
        return {"sample": sample, "value": len(sample)}

    async def verify(self, task, output):
        if self.mode == "verify_crash":
            raise ValueError("bad verifier")
        if self.mode == "verify_hang":
            await asyncio.sleep(5)
        answered = any(item["type"] == "message" and "done" in item["content"][0]["text"] for item in output)
        return VerifyResult(reward=1.0 if answered else 0.0, reward_components={"answered": 1.0 if answered else 0.0},
                            metrics={"tool_calls_seen": self.calls})

    def close(self):
        closed_sessions.append(self.mode)


def task(index=0, **row):
    return parse_task({"prompt": "Measure x then say done.", "environment": Lab.name, **row}, index=index)


def call(name="measure", **args):
    return CALL.format(name=name, args=json.dumps(args))
