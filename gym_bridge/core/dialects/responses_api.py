"""The `/v1/responses` wire format, for an endpoint that serves it from a chat-completions one.

Owns the request model (`ResponsesBody`) and what a stateless endpoint refuses
(`check_stateless`), the request as a chat-completions body (`to_chat_body`: an answered turn's
message and function calls become one assistant message again, so a resent history compares
equal to the chat path's and stays token-in), and a `chat.completion` answer as a Responses
`response` object (`to_response`) and as the events of a streamed one (`response_events`).
Items <-> chat messages for trajectories stay in `responses`; this module is the API's shape.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from gym_bridge.core.conversation import Message
from gym_bridge.core.dialects.chat import ApiError, to_chat_tool
from gym_bridge.core.dialects.responses import STATELESS, to_messages, unsupported



class ResponsesTool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ResponsesBody(BaseModel):
    """A `/v1/responses` request body; unknown fields are ignored, like `ChatBody` does."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    parallel_tool_calls: bool | None = None
    stream: StrictBool = False
    store: bool | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    background: bool | None = None


def check_stateless(body: ResponsesBody) -> None:
    """Raises ApiError 400 for a request that needs stored state (`previous_response_id`,
    `conversation`, `store: true`, `background: true`), naming the field."""
    for name in ("previous_response_id", "conversation"):
        if getattr(body, name) is not None:
            raise unsupported(f"{name} is not supported: {STATELESS}")
    if body.store:
        raise unsupported(f"store=true is not supported: {STATELESS}; send store=false or leave it out")
    if body.background:
        raise unsupported("background=true is not supported by the gym_bridge capture endpoint")


def to_chat_body(body: ResponsesBody) -> dict[str, Any]:
    """The chat-completions request body that asks for the same answer: `instructions` as the
    system message, the input items as chat messages, function tools as chat tools and
    `max_output_tokens` as `max_tokens`.

    Raises ApiError 400 naming the entry for an input item or tool it cannot serve.
    """
    messages: list[Message] = [{"role": "system", "content": body.instructions}] if body.instructions else []
    messages += to_messages(body.input)
    chat: dict[str, Any] = {"messages": messages, "model": body.model}
    if body.tools:
        chat["tools"] = [_chat_tool(tool, position) for position, tool in enumerate(body.tools)]
    settings = {"tool_choice": body.tool_choice, "max_tokens": body.max_output_tokens, "temperature": body.temperature, "top_p": body.top_p}
    chat.update({name: value for name, value in settings.items() if value is not None})
    return chat


def to_response(completion: Mapping[str, Any], *, request: ResponsesBody) -> dict[str, Any]:
    """A `chat.completion` answer as the Responses API's `response` object: output items
    (reasoning, the message with its `output_text`, one `function_call` per tool call), status
    `incomplete` when the answer was cut at the token limit, and the usage in Responses' names."""
    choice = completion["choices"][0]
    truncated = choice["finish_reason"] == "length"
    usage = completion["usage"]
    return {
        "id": "resp_" + completion["id"].removeprefix("chatcmpl-"), "object": "response",
        "created_at": completion.get("created", int(time.time())), "model": completion["model"],
        "status": "incomplete" if truncated else "completed", "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
        "instructions": request.instructions, "output": output_items(completion),
        "tools": [tool.model_dump(exclude_none=True) for tool in request.tools or []],
        "tool_choice": request.tool_choice or "auto", "parallel_tool_calls": request.parallel_tool_calls is not False,
        "temperature": request.temperature, "top_p": request.top_p, "max_output_tokens": request.max_output_tokens,
        "previous_response_id": None, "store": False, "metadata": {}, "reasoning": None, "text": {"format": {"type": "text"}},
        "usage": {"input_tokens": usage["prompt_tokens"], "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": usage["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": usage["total_tokens"]},
    }


def output_items(completion: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The output items of a chat completion's first choice, in the order the model wrote them:
    reasoning, the message (when it has text or no tool calls), the function calls."""
    message = completion["choices"][0]["message"]
    suffix = completion["id"].removeprefix("chatcmpl-")
    items: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        items.append({"type": "reasoning", "id": f"rs_{suffix}", "summary": [{"type": "summary_text", "text": message["reasoning_content"]}]})
    calls = message.get("tool_calls") or []
    if message.get("content") or not calls:
        items.append({"type": "message", "id": f"msg_{suffix}", "role": "assistant", "status": "completed",
                      "content": [{"type": "output_text", "text": message.get("content") or "", "annotations": [], "logprobs": []}]})
    for position, call in enumerate(calls):
        items.append({"type": "function_call", "id": f"fc_{suffix}_{position}", "call_id": call["id"], "name": call["function"]["name"],
                      "arguments": call["function"]["arguments"], "status": "completed"})
    return items


def _chat_tool(tool: ResponsesTool, position: int) -> dict[str, Any]:
    if tool.type != "function":
        raise unsupported(f"tools[{position}]: tools of type {tool.type!r} are not supported by the gym_bridge capture endpoint "
                           "(only function tools, which the harness runs)")
    if not tool.name:
        raise ApiError(400, f"tools[{position}].name: a function tool needs a name")
    return to_chat_tool({"name": tool.name, "description": tool.description or "", "parameters": tool.parameters})


def response_events(response: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A finished `response` as the events the Responses API streams for it: `response.created`
    and `response.in_progress` (no output yet), per output item its `added` event, its text or
    arguments as one delta and its `done` events, then `response.completed` (or
    `response.incomplete`) with the whole response; numbered by `sequence_number`."""
    opening = {**response, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    events: list[dict[str, Any]] = [{"type": "response.created", "response": opening},
                                    {"type": "response.in_progress", "response": opening}]
    for index, item in enumerate(response["output"]):
        events += _item_events(index, item)
    final = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    events.append({"type": final, "response": dict(response)})
    return [{**event, "sequence_number": number} for number, event in enumerate(events)]


def _item_events(index: int, item: Mapping[str, Any]) -> list[dict[str, Any]]:
    where = {"item_id": item["id"], "output_index": index}
    events: list[dict[str, Any]]
    if item["type"] == "message":
        part = item["content"][0]
        events = [{"type": "response.output_item.added", "output_index": index, "item": {**item, "status": "in_progress", "content": []}},
                  {"type": "response.content_part.added", **where, "content_index": 0, "part": {**part, "text": ""}},
                  {"type": "response.output_text.delta", **where, "content_index": 0, "delta": part["text"], "logprobs": []},
                  {"type": "response.output_text.done", **where, "content_index": 0, "text": part["text"], "logprobs": []},
                  {"type": "response.content_part.done", **where, "content_index": 0, "part": part}]
    elif item["type"] == "function_call":
        events = [{"type": "response.output_item.added", "output_index": index, "item": {**item, "status": "in_progress", "arguments": ""}},
                  {"type": "response.function_call_arguments.delta", **where, "delta": item["arguments"]},
                  {"type": "response.function_call_arguments.done", **where, "name": item["name"], "arguments": item["arguments"]}]
    else:  # reasoning: its summary text
        part = item["summary"][0]
        events = [{"type": "response.output_item.added", "output_index": index, "item": {**item, "summary": []}},
                  {"type": "response.reasoning_summary_part.added", **where, "summary_index": 0, "part": {**part, "text": ""}},
                  {"type": "response.reasoning_summary_text.delta", **where, "summary_index": 0, "delta": part["text"]},
                  {"type": "response.reasoning_summary_text.done", **where, "summary_index": 0, "text": part["text"]},
                  {"type": "response.reasoning_summary_part.done", **where, "summary_index": 0, "part": part}]
    return events + [{"type": "response.output_item.done", "output_index": index, "item": dict(item)}]
