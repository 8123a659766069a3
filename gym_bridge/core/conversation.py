"""One conversation, typed: the messages every part of gym_bridge passes around.

A discriminated union on `role` (system, user, assistant with its tool calls, tool), in the
chat-completions shape, so the hot path pays nothing: the messages are plain dicts at run time
(TypedDicts), rendered by a chat template and sent over HTTP as they are, while the type checker
sees every field. Each wire format converts to and from this form at its own edge
(`gym_bridge.core.dialects`); the chat template's view, whose keys depend on the template, is
`TemplateMessage`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, NotRequired, TypedDict, TypeVar

_M = TypeVar("_M", bound=Mapping[str, Any])

JsonObject = dict[str, Any]
"""A JSON object as decoded (tool arguments, tool schemas): its values are any JSON."""

FinishReason = Literal["stop", "length"]
"""Why one model call ended: `stop` (end of turn or a stop string) or `length` (its token cap)."""


class ToolCallFunction(TypedDict):
    name: str
    arguments: str
    """The arguments as a JSON object string, as the chat-completions API carries them."""


class ToolCall(TypedDict):
    id: str
    type: Literal["function"]
    function: ToolCallFunction


class SystemMessage(TypedDict):
    role: Literal["system"]
    content: str


class UserMessage(TypedDict):
    role: Literal["user"]
    content: str


class AssistantMessage(TypedDict):
    """A model turn: its text (None when it only calls tools, as the API sends it), its calls and,
    from servers that return them, the call's token ids (sent back so the prompt's prefix stays exact)."""

    role: Literal["assistant"]
    content: str | None
    tool_calls: NotRequired[list[ToolCall]]
    reasoning_content: NotRequired[str]
    prompt_token_ids: NotRequired[list[int]]
    generation_token_ids: NotRequired[list[int]]
    generation_log_probs: NotRequired[list[float]]


class ToolMessage(TypedDict):
    role: Literal["tool"]
    tool_call_id: str
    content: str
    name: NotRequired[str]


Message = SystemMessage | UserMessage | AssistantMessage | ToolMessage
"""One message of a conversation; `role` tells which."""

Role = Literal["system", "user", "assistant", "tool"]

TemplateMessage = dict[str, Any]
"""A message as a chat template is given it: its keys depend on the template (where the reasoning
goes, tool arguments as objects or text, tool calls written into the text), so it stays untyped."""


def tool_call(call_id: str, name: str, arguments: str) -> ToolCall:
    """One tool call in the conversation's form."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant_message(content: str | None, calls: list[ToolCall] | None = None, *, reasoning: str = "") -> AssistantMessage:
    """An assistant turn: `calls` only when there are some, `reasoning_content` only when not empty."""
    message: AssistantMessage = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = reasoning
    return message


def tool_message(call_id: str, content: str, *, name: str | None = None) -> ToolMessage:
    """A tool output answering call `call_id` (`name`: the tool's, for templates that show it)."""
    if name is None:
        return {"role": "tool", "tool_call_id": call_id, "content": content}
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


def tool_calls_of(message: Message) -> list[ToolCall]:
    """The tool calls of `message` ([] for every message but an assistant one that calls tools)."""
    if message["role"] != "assistant":
        return []
    return message.get("tool_calls") or []


def appended(previous: Sequence[Mapping[str, Any]], messages: Sequence[_M]) -> list[_M] | None:
    """The messages after `previous` when `messages` start with every one of them (the conversation
    was extended, not rewritten), else None: the message-level form of the prefix rule whose token
    form is `gym_bridge.core.trajectory.extends`."""
    if len(messages) < len(previous) or any(a != b for a, b in zip(messages, previous)):
        return None
    return list(messages[len(previous):])
