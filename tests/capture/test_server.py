"""The capture endpoint over loopback with the `openai` client: OpenAI's answer shape and its
error statuses, sessions chosen by URL or by API key."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from gym_bridge.capture.server import capture_server
from gym_bridge.capture.ledger import SessionLedger
from gym_bridge.capture.session import CaptureSession
from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.policy import SamplingParams, ScriptedPolicy

TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}]


def serve(template, script, check) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        session = CaptureSession(policy=ScriptedPolicy(script), template=template,
                                 ledger=SessionLedger(sampling=SamplingParams(max_new_tokens=32),
                                 limits=Limits(), model_name="policy", label="t"))
        async with capture_server().session(session) as base_url:
            await check(session, base_url)
        assert capture_server().port is None  # the last session closed: the server stopped

    asyncio.run(main())


def test_a_tool_call_is_answered_as_openai_does_and_the_key_alone_finds_the_session(smol_template, turn) -> None:
    call = turn('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>')

    async def check(session: CaptureSession, base_url: str) -> None:
        root = base_url.split("/s/")[0] + "/v1"
        async with openai.AsyncOpenAI(base_url=root, api_key=session.ledger.token, max_retries=0) as client:
            reply = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "1+2?"}], tools=TOOLS)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (tool_call,) = choice.message.tool_calls or []
        assert tool_call.function.name == "add" and json.loads(tool_call.function.arguments) == {"a": 1, "b": 2}
        assert reply.usage is not None and reply.usage.completion_tokens == len(call.token_ids)
        assert session.ledger.calls[0].completion_ids == call.token_ids and session.ledger.calls[0].logprobs == call.logprobs

    serve(smol_template, {"": [call]}, check)


@pytest.mark.parametrize(("change", "error", "status"), [
    ({"n": 2}, openai.BadRequestError, 400),
    ({"model": "gpt-4o"}, openai.NotFoundError, 404),
    ({"messages": []}, openai.BadRequestError, 400),
])
def test_requests_the_endpoint_cannot_serve_get_openai_statuses_and_are_recorded(smol_template, change, error, status) -> None:
    async def check(session: CaptureSession, base_url: str) -> None:
        async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
            request = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], **change}
            with pytest.raises(error) as raised:
                await client.chat.completions.create(**request)
        assert raised.value.status_code == status
        assert [e.status for e in session.ledger.errors] == [status] and session.ledger.calls == []

    serve(smol_template, {"": []}, check)


def test_an_unknown_key_is_401_and_an_unknown_session_404(smol_template) -> None:
    async def check(session: CaptureSession, base_url: str) -> None:
        root = base_url.split("/s/")[0]
        async with openai.AsyncOpenAI(base_url=root + "/v1", api_key="wrong", max_retries=0) as client:
            with pytest.raises(openai.AuthenticationError):
                await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
        async with openai.AsyncOpenAI(base_url=root + "/s/nope/v1", api_key="x", max_retries=0) as client:
            with pytest.raises(openai.NotFoundError):
                await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])

    serve(smol_template, {"": []}, check)
