"""What the capture endpoint refuses, over loopback: a body nested too deeply is a 400 (not a 500), a
body sent as anything but JSON a 415 (no OpenAI client sends one; a browser page may, cross-site),
and a Responses `function_call_output` that answers no earlier `function_call` a 400 naming its
call_id. Each refusal is recorded on the session, as the other error answers are."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from gym_bridge.capture.server import MAX_REQUEST_BYTES, capture_server
from gym_bridge.capture.ledger import SessionLedger
from gym_bridge.capture.session import CaptureSession
from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.policy import SamplingParams, ScriptedPolicy

HELLO = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}


def post(template, turn, path: str, bodies: list[tuple[bytes, dict[str, str]]]) -> tuple[CaptureSession, list[httpx.Response]]:  # type: ignore[no-untyped-def]
    """POST each body (with its headers) to the session's `path`; the session and the answers."""

    async def main() -> tuple[CaptureSession, list[httpx.Response]]:
        session = CaptureSession(policy=ScriptedPolicy({"": [turn("ok")] * len(bodies)}), template=template,
                                 ledger=SessionLedger(sampling=SamplingParams(max_new_tokens=8),
                                                      limits=Limits(), model_name="policy", label="t"))
        async with capture_server().session(session) as base_url:
            async with httpx.AsyncClient(timeout=60) as client:
                answers = [await client.post(base_url + path, content=body, headers=headers) for body, headers in bodies]
        return session, answers

    return asyncio.run(main())


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("path", ["/chat/completions", "/responses"])
def test_a_body_nested_a_hundred_thousand_levels_deep_is_a_400(smol_template, turn, path) -> None:
    key = "messages" if path == "/chat/completions" else "input"
    bodies = [f'{{"model": "policy", "{key}": [{{"role": "user", "content": {deep(100_000)}}}]}}'.encode(),
              f'{{"model": "policy", "{key}": [{{"role": "user", "content": "hi"}}], "extra": {deep(990)}}}'.encode()]
    session, answers = post(smol_template, turn, path, [(body, {"Content-Type": "application/json"}) for body in bodies])
    assert [answer.status_code for answer in answers] == [400, 400]
    assert all("nested too deeply" in answer.json()["error"]["message"] for answer in answers)
    assert [error.status for error in session.ledger.errors] == [400, 400] and session.ledger.calls == []


def test_tool_call_arguments_nested_too_deeply_are_a_400(smol_template, turn) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": deep(100_000)}}
    body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                                            {"role": "tool", "tool_call_id": "c1", "content": "x"}]}
    _, (answer,) = post(smol_template, turn, "/chat/completions", [(json.dumps(body).encode(), {"Content-Type": "application/json"})])
    assert answer.status_code == 400 and "nested too deeply" in answer.json()["error"]["message"]


def test_a_body_that_is_not_sent_as_json_is_a_415_and_json_types_are_served(smol_template, turn) -> None:
    body = json.dumps(HELLO).encode()
    refused = ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"]
    served = ["application/json", "application/json; charset=utf-8", "Application/JSON", "application/vnd.api+json"]
    session, answers = post(smol_template, turn, "/chat/completions",
                            [(body, {"Content-Type": kind}) for kind in refused + served] + [(body, {})])
    assert [answer.status_code for answer in answers] == [415] * 3 + [200] * 4 + [200]  # no Content-Type: read as JSON
    error = answers[0].json()["error"]
    assert error["code"] == "unsupported_media_type" and "'text/plain'" in error["message"] and "application/json" in error["message"]
    assert [e.status for e in session.ledger.errors] == [415] * 3 and len(session.ledger.calls) == 5


def test_an_orphan_function_call_output_is_a_400_naming_its_call_id(smol_template, turn) -> None:
    async def main() -> tuple[CaptureSession, openai.BadRequestError, str]:
        session = CaptureSession(policy=ScriptedPolicy({"": [turn("42")]}), template=smol_template,
                                 ledger=SessionLedger(sampling=SamplingParams(max_new_tokens=8),
                                                      limits=Limits(), model_name="policy", label="t"))
        async with capture_server().session(session) as base_url:
            async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
                with pytest.raises(openai.BadRequestError) as refused:
                    await client.responses.create(model="policy", input=[
                        {"role": "user", "content": "add 12 and 30"},
                        {"type": "function_call_output", "call_id": "call_nowhere", "output": "42"}])
                answered = await client.responses.create(model="policy", input=[
                    {"role": "user", "content": "add 12 and 30"},
                    {"type": "function_call", "call_id": "call_1", "name": "add", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "call_1", "output": "42"}])
        return session, refused.value, answered.output_text

    session, refused, answered = asyncio.run(main())
    assert refused.status_code == 400 and "'call_nowhere'" in refused.message and "input[1]" in refused.message
    assert answered == "42" and [e.status for e in session.ledger.errors] == [400] and len(session.ledger.calls) == 1


def test_a_body_over_the_size_limit_is_a_413_in_openais_shape(smol_template, turn) -> None:
    """Issue 37 item 5: the capture endpoint reads its body with the servers' one reader (`read_json`): a body over
    16 MiB is a 413 in OpenAI's error shape, recorded on the session (aiohttp answered it as plain text before),
    and the next call of the session is served."""
    big = json.dumps({**HELLO, "padding": "x" * (MAX_REQUEST_BYTES + 1)}).encode()
    session, answers = post(smol_template, turn, "/chat/completions", [(big, {"Content-Type": "application/json"}),
                                                                       (json.dumps(HELLO).encode(), {"Content-Type": "application/json"})])
    assert [answer.status_code for answer in answers] == [413, 200]
    assert f"larger than {MAX_REQUEST_BYTES} bytes" in answers[0].json()["error"]["message"]
    assert [error.status for error in session.ledger.errors] == [413] and len(session.ledger.calls) == 1
