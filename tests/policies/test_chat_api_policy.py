"""ChatAPIPolicy (chat completions and Responses, through the `openai` package) against a fake hosted
API on loopback: tool calls both ways, the message path of the engine, typed failures, and the
refusal to train on it."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.policy import (
    ChatRequest,
    SamplingParams,
    ScriptedPolicy,
    require_token_policy,
)
from gym_bridge.core.errors import BackendError, ContextOverflowError, TokenPolicyRequiredError
from gym_bridge.core.task import parse_task
from gym_bridge.core.dialects.responses import from_chat_messages, chat_turn_from_response
from gym_bridge.policies.chat_api import ChatAPIPolicy
from tests.support.http_server import app_in_thread
from tests.support.invariants import assert_token_invariants

WEATHER_ROW = {
    "responses_create_params": {"input": [{"role": "developer", "content": "Be brief."},
                                          {"role": "user", "content": "Weather in Oslo?"}]},
    "environment": "weather",
}
CALL_ARGS = json.dumps({"city": "Oslo"})


def fake_api() -> tuple[FastAPI, list[dict]]:
    """Chat completions and Responses endpoints whose behaviour the model name picks."""
    app, seen = FastAPI(), []

    def failure(model: str):
        if model == "overflow":
            return JSONResponse({"error": {"message": "This model's maximum context length is 8 tokens.",
                                           "code": "context_length_exceeded", "type": "invalid_request_error"}}, 400)
        if model == "broken":
            return JSONResponse({"error": {"message": "upstream exploded"}}, 500)
        if model == "garbage":
            return PlainTextResponse("<html>gateway</html>", 200, media_type="text/html")
        if model == "missing":
            return JSONResponse({"error": {"message": "The model `missing` does not exist"}}, 404)
        return None

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        seen.append(body)
        if (answer := failure(body["model"])) is not None:
            return answer
        answered_tool = any(message["role"] == "tool" for message in body["messages"])
        message = ({"role": "assistant", "content": "Cold in Oslo.", "reasoning_content": "easy"} if answered_tool else
                   {"role": "assistant", "content": None, "tool_calls": [
                       {"id": "x1", "type": "function", "function": {"name": "get_weather", "arguments": CALL_ARGS}}]})
        return {"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "stop" if answered_tool else "tool_calls"}],
                "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25}}

    @app.post("/v1/responses")
    async def responses(request: Request):
        body = await request.json()
        seen.append(body)
        if (answer := failure(body["model"])) is not None:
            return answer
        answered_tool = any(item.get("type") == "function_call_output" for item in body["input"])
        if answered_tool:
            output = [{"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "easy"}]},
                      {"type": "message", "id": "m1", "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": "Cold in Oslo.", "annotations": []}]}]
        else:
            output = [{"type": "function_call", "id": "fc1", "call_id": "x1", "name": "get_weather", "arguments": CALL_ARGS,
                       "status": "completed"}]
        return {"id": "r", "object": "response", "created_at": 0, "model": body["model"], "status": "completed",
                "output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": body.get("tools", []),
                "usage": {"input_tokens": 30, "output_tokens": 7, "total_tokens": 37,
                          "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}}

    return app, seen


@pytest.fixture(scope="module")
def api():
    app, seen = fake_api()
    with app_in_thread(app) as url:
        yield url + "/v1", seen


def run_weather(policy, repeats=1):
    task = parse_task(WEATHER_ROW, index=0)

    async def run():
        records = [record async for record in Engine(policy, None, EngineConfig(sampling=SamplingParams(temperature=0.5))).stream([task], repeats=repeats)]
        await policy.aclose()
        return records

    return asyncio.run(run())


@pytest.mark.parametrize("kind", ["chat", "responses"])
def test_tool_calling_rollout_through_a_chat_api(api, kind):
    url, seen = api
    seen.clear()
    [record] = run_weather(ChatAPIPolicy(model="ok", base_url=url, api=kind, max_retries=0))
    assert record.failure_kind is None and record.mask_sample is False and record.reward == 1.0
    assert [item["type"] for item in record.output] == ["function_call", "function_call_output", "reasoning", "message"]
    assert json.loads(record.output[0]["arguments"]) == {"city": "Oslo"}
    assert json.loads(record.output[1]["output"])["city"] == "Oslo"  # the tool really ran
    row = record.to_dict()
    assert row["tokens"]["completion_ids"] == [] and row["tokens"]["prompt_ids"] == []
    assert_token_invariants(row)
    first, second = seen
    assert first["temperature"] == 0.5 and first["tools"]
    if kind == "chat":
        assert first["messages"][0] == {"role": "system", "content": "Be brief."}
        assert second["messages"][-2]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": CALL_ARGS}
        assert second["messages"][-1] == {"role": "tool", "tool_call_id": second["messages"][-2]["tool_calls"][0]["id"],
                                          "content": record.output[1]["output"]}
        assert row["response"]["usage"] == {"input_tokens": 40, "output_tokens": 10, "total_tokens": 50}
    else:
        assert first["tools"][0]["name"] == "get_weather" and first["store"] is False
        call, output = second["input"][-2:]
        assert (call["type"], call["name"], output["type"]) == ("function_call", "get_weather", "function_call_output")
        assert call["call_id"] == output["call_id"]
        assert row["response"]["usage"]["output_tokens"] == 14


def test_chat_policy_records_carry_no_policy_version_as_the_async_page_says(api):
    """No chat server reports the weights version it sampled under, and VersionedPolicy wraps token policies only:
    the record has no `policy_version` on any item and no version metrics; docs/training/async.md says so."""
    from pathlib import Path

    from gym_bridge.policies.versioned import VersionedPolicy

    url, _ = api
    [record] = run_weather(ChatAPIPolicy(model="ok", base_url=url, api="chat", max_retries=0))
    assert record.failure_kind is None and record.policy_versions == ()
    row = record.to_dict()
    assert not any("policy_version" in item for item in row["response"]["output"])
    assert not {"policy_version_min", "policy_version_max"} & set(row["metrics"])
    assert not hasattr(VersionedPolicy, "chat")
    page = " ".join((Path(__file__).parents[2] / "docs" / "training" / "async.md").read_text(encoding="utf-8").split())
    assert "Chat policies carry no version: a `ChatAPIPolicy`" in page


@pytest.mark.parametrize(("model", "kind", "match"), [
    ("overflow", ContextOverflowError, "maximum context length"),
    ("broken", BackendError, "HTTP 500"),
    ("missing", BackendError, "HTTP 404"),
    ("garbage", BackendError, "not a JSON object"),
])
def test_api_failures_are_typed(api, model, kind, match):
    url, _ = api
    policy = ChatAPIPolicy(model=model, base_url=url, api="chat", max_retries=0, request_timeout_s=5)
    request = ChatRequest(messages=[{"role": "user", "content": "hi"}], tools=(), sampling=SamplingParams())

    async def call():
        try:
            return await policy.chat(request)
        finally:
            await policy.aclose()

    with pytest.raises(kind, match=match):
        asyncio.run(call())


def test_failed_api_rollouts_are_infra_and_context_overflow_records(api):
    url, _ = api
    [broken] = run_weather(ChatAPIPolicy(model="broken", base_url=url, max_retries=1))
    [overflow] = run_weather(ChatAPIPolicy(model="overflow", base_url=url, max_retries=1))
    assert (broken.failure_kind, broken.mask_sample) == ("infra", True)
    assert (overflow.failure_kind, overflow.mask_sample) == ("context_overflow", True)


def test_training_refuses_a_chat_policy_and_names_the_alternatives(turn):
    policy = ChatAPIPolicy(model="gpt-x", base_url="http://127.0.0.1:1/v1")
    with pytest.raises(TokenPolicyRequiredError, match="RemotePolicy.*VLLMEnginePolicy.*TransformersPolicy"):
        require_token_policy(policy)
    scripted = ScriptedPolicy({"": [turn("hi")]})
    assert require_token_policy(scripted) is scripted


def test_responses_input_maps_tool_calls_to_items():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": CALL_ARGS}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": '{"t": 3}'},
    ]
    assert from_chat_messages(messages) == [
        {"type": "message", "role": "system", "content": "Be brief."},
        {"type": "message", "role": "user", "content": "Weather?"},
        {"type": "message", "role": "assistant", "content": "Let me check."},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": CALL_ARGS},
        {"type": "function_call_output", "call_id": "c1", "output": '{"t": 3}'},
    ]


def test_responses_answers_stop_strings_and_length():
    text = {"type": "message", "content": [{"type": "output_text", "text": "a</b>c"}]}
    turn = chat_turn_from_response({"output": [text], "status": "completed"}, stop=("</b>",))
    assert (turn.text, turn.finish_reason) == ("a</b>", "stop")  # cut after the first stop string, which is kept
    turn = chat_turn_from_response({"output": [text], "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}})
    assert turn.finish_reason == "length"


def test_responses_parts_with_null_text_read_as_empty():
    answer = {"output": [
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": None}], "content": [{"type": "reasoning_text", "text": "r"}]},
        {"type": "message", "content": [{"type": "output_text", "text": None}, {"type": "output_text", "text": "ok"}]},
    ], "status": "completed"}
    turn = chat_turn_from_response(answer)
    assert (turn.text, turn.reasoning) == ("ok", "r")


class ScriptedChatPolicy:
    """A ChatPolicy that replays turns and records the requests it got."""

    def __init__(self, turns):
        self.turns, self.requests = list(turns), []

    async def chat(self, request):
        self.requests.append(request)
        return self.turns.pop(0)


def test_the_message_path_of_the_engine():
    from gym_bridge.core.agent_loop import Limits
    from gym_bridge.core.turn import ToolCall, Turn

    policy = ScriptedChatPolicy([
        # a server without a tool parser: the call is in the text, and is parsed like a token policy's
        Turn(text='<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>', usage={"output_tokens": 6}),
        Turn(text="", calls=(ToolCall(name="get_weather", arguments="{not json"),), usage={"output_tokens": 6}),
        Turn(text="never asked for", usage={"output_tokens": 6}),
    ])
    task = parse_task(WEATHER_ROW, index=0)
    config = EngineConfig(sampling=SamplingParams(max_new_tokens=8), limits=Limits(max_completion_tokens=12))

    async def run():
        return [record async for record in Engine(policy, None, config).stream([task])]

    [record] = asyncio.run(run())
    assert record.failure_kind is None and record.finish_reason == "budget"  # 6 + 6 output tokens of 12: none left
    assert [request.sampling.max_new_tokens for request in policy.requests] == [8, 6]  # min(8, 12 - 6) the second time
    second = policy.requests[1].messages
    assert second[0] == {"role": "system", "content": "Be brief."}
    assert second[-2]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": CALL_ARGS}
    assert second[-1]["role"] == "tool" and json.loads(second[-1]["content"])["city"] == "Oslo"
    outputs = [item for item in record.output if item["type"] == "function_call_output"]
    assert "malformed tool call: 'arguments' is not valid JSON" in outputs[1]["output"]
    assert record.to_dict()["response"]["usage"]["output_tokens"] == 12
