"""A maintained third-party agent framework run unmodified through the capture endpoint: the OpenAI
Agents SDK (`openai-agents`, package `agents`) with its own `add` function tool, over its chat
completions model and its Responses model, run plainly and streamed (`Runner.run_streamed`),
against the scripted policy. Skipped where the SDK is not installed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gym_bridge.capture import HarnessEnvironment
from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.policy import SamplingParams, ScriptedPolicy
from gym_bridge.core.task import load_tasks

agents = pytest.importorskip("agents")

EXAMPLE = Path(__file__).parents[2] / "environments" / "harness_example" / "data" / "example.jsonl"
ADD_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 30}}\n</tool_call>'


@agents.function_tool
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


def sdk_harness(*, api: str, streamed: bool) -> type[HarnessEnvironment]:
    """A harness running the SDK's own loop (its system prompt, its tool schema, its message
    history) over its chat-completions or Responses model, with `Runner.run` or `Runner.run_streamed`."""

    async def sdk_agent(client, task: dict) -> str:  # type: ignore[no-untyped-def]
        agents.set_tracing_disabled(True)
        model_class = agents.OpenAIChatCompletionsModel if api == "chat" else agents.OpenAIResponsesModel
        model = model_class(model=task["model"], openai_client=client)
        agent = agents.Agent(name="calculator", instructions=task["messages"][0]["content"], tools=[add], model=model)
        question = task["messages"][-1]["content"]
        if not streamed:
            return str((await agents.Runner.run(agent, question, max_turns=4)).final_output)
        result = agents.Runner.run_streamed(agent, question, max_turns=4)
        kinds = {event.type async for event in result.stream_events()}
        assert "raw_response_event" in kinds  # the SDK read the endpoint's stream
        return str(result.final_output)

    class SdkHarness(HarnessEnvironment):
        name = "openai_agents_harness"
        agent = sdk_agent

        def score(self, task, answer):  # type: ignore[no-untyped-def]
            return float("42" in answer)

    return SdkHarness


@pytest.mark.parametrize(("api", "streamed"), [("chat", False), ("chat", True), ("responses", False), ("responses", True)])
def test_the_openai_agents_sdk_runs_its_tool_loop_through_the_endpoint_token_exactly(smol_template, turn, api, streamed) -> None:
    first, second = turn(ADD_CALL), turn("12 + 30 = 42")
    policy = ScriptedPolicy({"": [first, second]})
    engine = Engine(policy, smol_template, EngineConfig(sampling=SamplingParams(max_new_tokens=64), limits=Limits(),
                                                       deadline_s=60, template_check="off"))
    harness = sdk_harness(api=api, streamed=streamed)
    record = asyncio.run(engine.rollout(load_tasks(EXAMPLE)[0], env_class=harness)).to_dict()
    assert record["failure_kind"] is None, record["failure_reason"]
    assert record["reward"] == 1.0 and len(policy.calls) == 2
    head = list(policy.calls[0].prompt_ids) + first.token_ids
    assert list(policy.calls[1].prompt_ids[: len(head)]) == head  # the SDK sent the answer back as given: token-in
    tokens = record["tokens"]
    env_ids = list(policy.calls[1].prompt_ids[len(head):])
    assert tokens["completion_ids"] == first.token_ids + env_ids + second.token_ids and "segments" not in tokens
    assert "42" in smol_template.tokenizer.decode(env_ids)  # the SDK ran its own tool
    assert record["metrics"]["verify"]["token_in_calls"] == 1 and record["metrics"]["verify"]["endpoint_errors"] == []
