"""OpenEnv's own client loop on a scripted play, for the conformance tests; runs in OpenEnv's venv (not collected).

`python openenv_reference.py '[{"url": ..., "mode": "simulation" | "mcp", "reset": {...}, "turns": [[name, args], ...]}, ...]'`
prints `{"rewards": [...]}`: for each play, the reward OpenEnv's `build_harness_rollout_func` (its TRL rollout function, with the
`MCPHarnessAdapter` loop and a `StepEnvSessionAdapter` over OpenEnv's own client) gives a model that makes one
tool call per turn from `turns`, then answers without a call.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from openenv.core.env_server.mcp_types import CallToolAction, Tool
from openenv.core.generic_client import GenericEnvClient
from openenv.core.harness.rollout import MCPHarnessAdapter, ModelStepResult, StepEnvSessionAdapter, build_harness_rollout_func
from openenv.core.llm_client import LLMResponse, ToolCall
from openenv.core.mcp_client import MCPToolClient


def main(spec: dict[str, Any]) -> float:
    mcp = spec["mode"] == "mcp"
    names = sorted({name for name, _ in spec["turns"]})

    class Factory:
        def create(self, task: Any = None, **_: Any) -> StepEnvSessionAdapter:
            client = MCPToolClient(base_url=spec["url"]) if mcp else GenericEnvClient(base_url=spec["url"])
            return StepEnvSessionAdapter(
                client, task=task, tool_specs=[Tool(name=name, description="", input_schema={}) for name in names],
                action_builder=(lambda name, args: CallToolAction(tool_name=name, arguments=args)) if mcp else (lambda name, args: args),
                initial_messages_builder=lambda result, task: [{"role": "user", "content": str(task)}],
                reset_kwargs=spec["reset"],
            )

    def model_step_builder(trainer: Any, session: Any) -> Any:
        turns = iter(spec["turns"])

        def step(messages: Any, tools: Any, sampling: Any) -> ModelStepResult:
            turn = next(turns, None)
            calls = [] if turn is None else [ToolCall(id=f"call_{len(messages)}", name=turn[0], args=turn[1])]
            return ModelStepResult(response=LLMResponse(content="" if calls else "done", tool_calls=calls))

        return step

    rollout = build_harness_rollout_func(session_factory=Factory(), harness_adapter=MCPHarnessAdapter(), model_step_builder=model_step_builder)
    reward: float = rollout(["play"], None)["env_reward"][0]
    return reward


if __name__ == "__main__":
    print(json.dumps({"rewards": [main(spec) for spec in json.loads(sys.argv[1])]}))
