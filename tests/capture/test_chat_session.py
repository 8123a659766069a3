"""The capture endpoint in front of a chat policy (how a harness runs behind NeMo RL's `/run`): the
answered assistant message goes back to the policy with its call's token ids, so the server can keep
the prefix exact; a chat policy without token ids (a hosted API) is a clear `infra` failure.

The chat policy here records what it is sent and answers from a script: a hosted API cannot run
here, and the real path (NeMo RL's server shape, `gym-bridge serve-model`) is covered end to end by
`tests/test_conformance.py`."""

from __future__ import annotations

import asyncio

import openai
import pytest

from gym_bridge.capture import HarnessEnvironment
from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.policy import ChatRequest, SamplingParams
from gym_bridge.core.task import parse_task
from gym_bridge.core.turn import CallTokens, ToolCall, Turn

ROW = {"responses_create_params": {"input": [{"role": "user", "content": "What is 12 + 30?"}], "tools": [
    {"type": "function", "name": "add", "description": "Add.", "parameters": {"type": "object", "properties": {}}}]},
       "agent_ref": {"name": "chat_capture_harness"}}


class RecordingChat:
    """Answers a tool call, then text; with `tokens` each answer carries made-up ids that extend the last call."""

    def __init__(self, *, tokens: bool) -> None:
        self.tokens, self.requests = tokens, []

    async def chat(self, request: ChatRequest) -> Turn:
        self.requests.append(request)
        first = len(self.requests) == 1
        tokens = None
        if self.tokens:
            prompt = [1, 2, 3] if first else [1, 2, 3, 10, 11, 20, 21]
            tokens = CallTokens(prompt_token_ids=prompt, generation_token_ids=[10, 11] if first else [30, 31],
                                generation_log_probs=[-0.5, -0.25] if first else [-0.125, -0.0625])
        if first:
            return Turn(text="", calls=(ToolCall(name="add", arguments='{"a": 12, "b": 30}'),), tokens=tokens)
        return Turn(text="42", tokens=tokens)


async def tool_agent(client: openai.AsyncOpenAI, task: dict) -> str:
    messages = list(task["messages"])
    reply = (await client.chat.completions.create(model=task["model"], messages=messages, tools=task["tools"])).choices[0].message
    messages += [reply.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": reply.tool_calls[0].id, "content": "42"}]
    final = await client.chat.completions.create(model=task["model"], messages=messages, tools=task["tools"])
    return final.choices[0].message.content or ""


async def responses_tool_agent(client: openai.AsyncOpenAI, task: dict) -> str:
    """The same loop over `/v1/responses`: the output items go back as input."""
    params = task["row"]["responses_create_params"]
    items = list(params["input"])
    reply = await client.responses.create(model=task["model"], input=items, tools=params["tools"])
    items += [item.model_dump(exclude_none=True) for item in reply.output]
    items.append({"type": "function_call_output", "call_id": reply.output[-1].call_id, "output": "42"})  # type: ignore[union-attr]
    return (await client.responses.create(model=task["model"], input=items, tools=params["tools"])).output_text


class ToolHarness(HarnessEnvironment):
    name = "chat_capture_harness"
    agent = tool_agent

    def score(self, task, answer):  # type: ignore[no-untyped-def]
        return float(answer == "42")


class ResponsesToolHarness(ToolHarness):
    agent = responses_tool_agent


def rollout(policy: RecordingChat, harness: type[HarnessEnvironment] = ToolHarness) -> dict:
    engine = Engine(policy, None, EngineConfig(sampling=SamplingParams(max_new_tokens=32), deadline_s=30))  # type: ignore[arg-type]
    return asyncio.run(engine.rollout(parse_task(ROW, index=0), env_class=harness)).to_dict()


@pytest.mark.parametrize("harness", [ToolHarness, ResponsesToolHarness], ids=["chat_completions", "responses"])
def test_the_answered_message_goes_back_with_its_token_ids_and_the_calls_are_captured(harness) -> None:
    policy = RecordingChat(tokens=True)
    record = rollout(policy, harness)
    assert record["failure_kind"] is None, record["failure_reason"]
    assert record["reward"] == 1.0
    echoed = [m for m in policy.requests[1].messages if m["role"] == "assistant"]
    assert len(echoed) == 1 and echoed[0]["prompt_token_ids"] == [1, 2, 3] and echoed[0]["generation_token_ids"] == [10, 11]
    assert policy.requests[1].messages[-1] == {"role": "tool", "content": "42", "tool_call_id": echoed[0]["tool_calls"][0]["id"]}
    tokens = record["tokens"]
    assert tokens["prompt_ids"] == [1, 2, 3] and tokens["completion_ids"] == [10, 11, 20, 21, 30, 31]
    assert tokens["completion_mask"] == [1, 1, 0, 0, 1, 1]
    assert tokens["completion_logprobs"] == [-0.5, -0.25, 0.0, 0.0, -0.125, -0.0625]
    assert record["metrics"]["verify"]["token_in_calls"] == 1
    assert [item["type"] for item in record["response"]["output"]] == ["function_call", "function_call_output", "message"]


def test_a_chat_policy_without_token_ids_is_an_infra_failure_that_says_so() -> None:
    record = rollout(RecordingChat(tokens=False))
    assert record["failure_kind"] == "infra" and "answered without token ids" in record["failure_reason"]


def test_the_session_interface_is_a_protocol_both_sessions_meet_by_holding_a_ledger() -> None:
    """`SessionState` is what the endpoint and the harness loop need (a Protocol, checked by mypy --strict):
    both sessions hold the shared `SessionLedger` as a field and inherit from nothing; each writes its own
    `chat_completions`, and `responses` is the ledger's, written once."""
    import dataclasses

    from gym_bridge.capture.chat_session import ChatCaptureSession
    from gym_bridge.capture.ledger import SessionLedger
    from gym_bridge.capture.session import CaptureSession, SessionState

    assert getattr(SessionState, "_is_protocol", False)
    for session in (CaptureSession, ChatCaptureSession):
        assert session.__mro__ == (session, object)
        assert {field.name: field.type for field in dataclasses.fields(session)}["ledger"] == "SessionLedger"
        assert "chat_completions" in vars(session) and "responses" not in vars(session)
    assert {"responses", "close", "fail", "turn", "reserve", "sampled"} <= set(vars(SessionLedger))
