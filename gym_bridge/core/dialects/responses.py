"""The Responses dialect: Responses items <-> chat messages.

Trajectories and task inputs are Responses items (`message`, `reasoning`, `function_call`,
`function_call_output`); chat messages are the internal form the agent loop and the chat
template work on (an item's text is read by `gym_bridge.core.items.item_text`, a trajectory's answer by
`gym_bridge.core.trajectory.final_text`). This module turns a Responses `input` into the conversation (`to_messages`,
the one converter: task inputs and `/v1/responses` requests alike, call ids kept) and the conversation
back into Responses input items (`from_chat_messages`), and a chat policy's Responses API request
and the turn in its answer (`responses_request`, `chat_turn_from_response`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from gym_bridge.core.conversation import Message, tool_call, tool_calls_of
from gym_bridge.core.dialects.chat import ApiError, tool_call_arguments
from gym_bridge.core.items import content_text
from gym_bridge.core.policy import ChatRequest
from gym_bridge.core.turn import ToolCall, Turn


def to_messages(request_input: str | Sequence[Mapping[str, Any]]) -> list[Message]:
    """A Responses `input` (a string, messages or items) as the conversation: `developer` is
    `system`, an assistant message and the function calls after it are one assistant message with
    `tool_calls` (ids and arguments strings as given), a `function_call_output` is a tool message
    with its call's id, and reasoning items are left out (chat messages carry no reasoning back).

    Raises ApiError 400 naming the entry it cannot read (an unknown role or item, non-text content,
    a `function_call_output` whose `call_id` no earlier `function_call` has, as OpenAI's API does).
    """
    if isinstance(request_input, str):
        return [{"role": "user", "content": request_input}]
    if not request_input:
        raise ApiError(400, "input must not be empty")
    messages: list[Message] = []
    call_ids: set[str] = set()
    for position, entry in enumerate(request_input):
        if not isinstance(entry, Mapping):
            raise ApiError(400, f"input[{position}]: expected a message or a Responses item, got {type(entry).__name__}")
        kind = entry.get("type", "message")
        if kind == "message":
            messages.append(_message(entry, position))
        elif kind == "function_call":
            call_id = _field(entry, "call_id", position)
            call_ids.add(call_id)
            arguments = entry.get("arguments") or "{}"
            tool_call_arguments(arguments)  # a JSON object, or a 400 naming it
            call = tool_call(call_id, _field(entry, "name", position), arguments)
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last["tool_calls"] = [*last.get("tool_calls", []), call]
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = _content_text(entry.get("output"), f"input[{position}].output")
            call_id = _field(entry, "call_id", position)
            if call_id not in call_ids:
                raise ApiError(400, f"input[{position}]: no function_call found for function_call_output with call_id {call_id!r}: "
                                    "send the function_call item it answers earlier in `input`")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
        elif kind == "reasoning":
            continue
        elif kind == "item_reference":
            raise unsupported(f"input[{position}]: item_reference is not supported: {STATELESS}")
        else:
            raise unsupported(f"input[{position}]: items of type {kind!r} are not supported by gym_bridge "
                              "(only message, function_call, function_call_output and reasoning)")
    return messages


STATELESS = "the gym_bridge capture endpoint is stateless (nothing is stored between calls): send the whole conversation as `input`"


def _message(entry: Mapping[str, Any], position: int) -> Message:
    role = entry.get("role")
    content = _content_text(entry.get("content"), f"input[{position}].content")
    if role in ("system", "developer"):
        return {"role": "system", "content": content}
    if role == "user":
        return {"role": "user", "content": content}
    if role == "assistant":
        return {"role": "assistant", "content": content}
    raise ApiError(400, f"input[{position}].role: expected user, system, developer or assistant, got {role!r}")


def _content_text(content: Any, where: str) -> str:
    """The text of a message's content or a tool output: a string, or text parts joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{where}: expected a string or a list of text parts")
    texts = []
    for position, part in enumerate(content):
        if not isinstance(part, Mapping) or part.get("type") not in ("input_text", "output_text", "text", "refusal"):
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            raise unsupported(f"{where}[{position}]: only text parts are supported by gym_bridge, got {kind!r}")
        texts.append(str(part.get("text", part.get("refusal", ""))))
    return "".join(texts)


def _field(entry: Mapping[str, Any], name: str, position: int) -> str:
    value = entry.get(name)
    if not isinstance(value, str):
        raise ApiError(400, f"input[{position}].{name}: a {entry.get('type')} item needs a string {name}")
    return value


def unsupported(message: str) -> ApiError:
    """A 400 for a feature gym_bridge does not serve (OpenAI's `unsupported_parameter` code)."""
    return ApiError(400, message, code="unsupported_parameter")


def from_chat_messages(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """Chat messages as Responses input items: a message per non-empty content, a `function_call`
    per tool call (its id and arguments string as given) and a `function_call_output` per tool message."""
    items: list[dict[str, Any]] = []
    for message in messages:
        if message["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": message["tool_call_id"], "output": message["content"]})
            continue
        if message["content"]:
            items.append({"type": "message", "role": message["role"], "content": message["content"]})
        for call in tool_calls_of(message):
            function = call["function"]
            items.append({"type": "function_call", "call_id": call["id"], "name": function["name"], "arguments": function["arguments"]})
    return items


def to_responses_tool(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A function schema (`name`, `description`, `parameters`) as a Responses `tools` entry."""
    return {"type": "function", "name": schema["name"], "description": schema.get("description", ""),
            "parameters": schema.get("parameters") or {"type": "object", "properties": {}}}


def responses_request(request: ChatRequest, *, model: str) -> dict[str, Any]:
    """The Responses API request for one turn (no stop strings or seed: the API has none; nothing stored)."""
    sampling = request.sampling
    params: dict[str, Any] = {
        "model": model,
        "input": from_chat_messages(request.messages),
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "max_output_tokens": sampling.max_new_tokens,
        "store": False,
    }
    if request.tools:
        params["tools"] = [to_responses_tool(schema) for schema in request.tools]
    return params


def chat_turn_from_response(response: dict[str, Any], *, stop: tuple[str, ...] = ()) -> Turn:
    """A Responses answer as a `Turn`: output text, reasoning summaries and `function_call` items.

    Stop strings, which the Responses API lacks, cut the text after the first one.
    """
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCall] = []
    for item in response.get("output") or []:
        kind = item.get("type")
        if kind == "message":
            texts.append(content_text(item.get("content")))
        elif kind == "reasoning":
            reasoning.extend(part.get("text") or "" for part in item.get("summary") or [])
            reasoning.extend(part.get("text") or "" for part in item.get("content") or [] if part.get("type") == "reasoning_text")
        elif kind == "function_call":
            calls.append(ToolCall(name=item.get("name", ""), arguments=item.get("arguments") or "{}"))
    text = "".join(texts)
    finish_reason: Literal["stop", "length"] = "stop"
    details = response.get("incomplete_details") or {}
    if response.get("status") == "incomplete" and details.get("reason") == "max_output_tokens":
        finish_reason = "length"
    cuts = [text.find(s) + len(s) for s in stop if s in text]
    if cuts:
        text, finish_reason, calls = text[: min(cuts)], "stop", []
    usage = response.get("usage") or {}
    return Turn(
        text=text, reasoning="\n".join(r for r in reasoning if r), calls=tuple(calls), finish_reason=finish_reason,
        usage={"input_tokens": int(usage.get("input_tokens") or 0), "output_tokens": int(usage.get("output_tokens") or 0)},
    )
