"""`stream: true` on the capture endpoint, read by the real `openai` client over loopback: the
streamed chunks reassemble (with the client's own accumulator) to the non-streamed answer, and
the captured tokens do not depend on streaming."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from gym_bridge.capture.session import CaptureSession
from gym_bridge.core.template.chat_template import ChatTemplate
from tests.capture.endpoint import serve

TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}]
TWO_CALLS = ('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
             '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>')
QUESTION = [{"role": "user", "content": "1+2 and 3+4?"}]


def comparable(message) -> dict:  # type: ignore[no-untyped-def]
    """A message without the client's parsing extras (a streamed call keeps its delta `index`) and
    with call ids left out (each call gets its own)."""
    dumped = message.model_dump(exclude_none=True, exclude={"parsed": True})
    for call in dumped.get("tool_calls") or []:
        call.pop("id")
        call.pop("index", None)
        call["function"].pop("parsed_arguments", None)
    return dumped


@pytest.mark.parametrize("text", ["12 + 30 = 42", TWO_CALLS, "<think>add them</think>" + TWO_CALLS],
                         ids=["content", "tool_calls", "reasoning"])
def test_a_streamed_answer_reassembles_to_the_plain_answer_and_captures_the_same_tokens(smol_tokenizer, turn, text) -> None:
    generation = turn(text)
    template = ChatTemplate(smol_tokenizer, reasoning_parser="qwen3")  # SmolLM2's template, `<think>` read as reasoning

    async def check(session: CaptureSession, client: openai.AsyncOpenAI, base_url: str) -> None:
        plain = await client.chat.completions.create(model="policy", messages=QUESTION, tools=TOOLS)
        async with client.chat.completions.stream(model="policy", messages=QUESTION, tools=TOOLS,
                                                  stream_options={"include_usage": True}) as stream:
            chunks = [event.chunk async for event in stream if event.type == "chunk"]
            streamed = await stream.get_final_completion()
        assert comparable(streamed.choices[0].message) == comparable(plain.choices[0].message)
        assert streamed.choices[0].finish_reason == plain.choices[0].finish_reason
        assert streamed.usage == plain.usage and chunks[-1].choices == [] and chunks[-1].usage == plain.usage
        assert all(chunk.object == "chat.completion.chunk" and chunk.id == chunks[0].id for chunk in chunks)
        assert chunks[0].choices[0].delta.role == "assistant"
        first, second = session.ledger.calls
        assert first == second and first.completion_ids == generation.token_ids and first.logprobs == generation.logprobs
        assert session.ledger.errors == []
        assert ("reasoning_content" in comparable(plain.choices[0].message)) == ("<think>" in text)

    serve(template, {"": [generation, generation]}, check)


def test_tool_call_deltas_carry_index_id_type_and_name_before_the_arguments(smol_template, turn) -> None:
    async def check(session: CaptureSession, client: openai.AsyncOpenAI, base_url: str) -> None:
        stream = await client.chat.completions.create(model="policy", messages=QUESTION, tools=TOOLS, stream=True)
        chunks = [chunk async for chunk in stream]
        calls = [call for chunk in chunks for choice in chunk.choices for call in choice.delta.tool_calls or []]
        assert [(call.index, call.type, call.function.name) for call in calls if call.id] == [(0, "function", "add"), (1, "function", "add")]
        arguments = {index: "".join(call.function.arguments or "" for call in calls if call.index == index) for index in (0, 1)}
        assert [json.loads(arguments[0]), json.loads(arguments[1])] == [{"a": 1, "b": 2}, {"a": 3, "b": 4}]
        finishes = [choice.finish_reason for chunk in chunks for choice in chunk.choices]
        assert finishes[-1] == "tool_calls" and set(finishes[:-1]) == {None}
        assert all(chunk.usage is None for chunk in chunks)  # no include_usage: no usage chunk

    serve(smol_template, {"": [turn(TWO_CALLS)]}, check)


def test_the_wire_is_server_sent_events_ending_with_done(smol_template, turn) -> None:
    async def check(session: CaptureSession, client: openai.AsyncOpenAI, base_url: str) -> None:
        async with httpx.AsyncClient() as http:
            reply = await http.post(f"{base_url}/chat/completions", json={"messages": QUESTION, "stream": True})
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        events = reply.text.split("\n\n")
        assert events[-2:] == ["data: [DONE]", ""]
        chunks = [json.loads(event.removeprefix("data: ")) for event in events[:-2]]
        assert "".join(chunk["choices"][0]["delta"].get("content", "") for chunk in chunks) == "42"

    serve(smol_template, {"": [turn("42")]}, check)


def test_stream_options_without_stream_is_a_400_that_is_recorded(smol_template) -> None:
    async def check(session: CaptureSession, client: openai.AsyncOpenAI, base_url: str) -> None:
        with pytest.raises(openai.BadRequestError, match="stream_options"):
            await client.chat.completions.create(model="policy", messages=QUESTION, stream_options={"include_usage": True})
        assert [error.status for error in session.ledger.errors] == [400] and session.ledger.calls == []

    serve(smol_template, {"": []}, check)


def test_a_stream_flag_that_is_not_a_json_boolean_is_a_400(smol_template) -> None:
    async def check(session: CaptureSession, client: openai.AsyncOpenAI, base_url: str) -> None:
        async with httpx.AsyncClient() as http:
            answer = await http.post(f"{base_url}/chat/completions", json={"model": "policy", "messages": QUESTION, "stream": "false"},
                                     headers={"Authorization": "Bearer unused"})
        assert answer.status_code == 400 and "stream" in answer.text
        assert [error.status for error in session.ledger.errors] == [400] and session.ledger.calls == []

    serve(smol_template, {"": []}, check)
