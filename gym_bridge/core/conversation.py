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
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict, TypeVar

if TYPE_CHECKING:
    from gym_bridge.core.turn import Turn

_M = TypeVar("_M", bound=Mapping[str, Any])

JsonObject = dict[str, Any]
"""A JSON object as decoded (tool arguments, tool schemas): its values are any JSON."""

FinishReason = Literal["stop", "length"]
"""Why one model call ended: `stop` (end of turn or a stop string) or `length` (its token cap)."""


class ToolCallFunction(TypedDict):
    name: str
    arguments: str
    """The arguments as a JSON object string, as the chat-completions API carries them."""


class MessageToolCall(TypedDict):
    """A tool call as an assistant message carries it (the chat-completions shape)."""

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
    tool_calls: NotRequired[list[MessageToolCall]]
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


def tool_call(call_id: str, name: str, arguments: str) -> MessageToolCall:
    """One tool call in the conversation's form."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant_message(turn: Turn) -> AssistantMessage:
    """A model turn as the assistant message that carries it (its one converter from `Turn`): its text (None when
    it only calls tools, as the API sends it), its calls named as the turn names them, `reasoning_content` when it
    has reasoning, and the call's token fields when it has them (sent back so a server keeps the prefix exact)."""
    message: AssistantMessage = {"role": "assistant", "content": (turn.text or None) if turn.calls else turn.text}
    if turn.calls:
        message["tool_calls"] = [tool_call(call.id or "", call.name, call.arguments) for call in turn.calls]
    if turn.reasoning:
        message["reasoning_content"] = turn.reasoning
    tokens = turn.tokens
    if tokens is not None:
        message["prompt_token_ids"] = tokens.prompt_token_ids
        message["generation_token_ids"] = tokens.generation_token_ids
        message["generation_log_probs"] = tokens.generation_log_probs
    return message


def tool_message(call_id: str, content: str, *, name: str | None = None) -> ToolMessage:
    """A tool output answering call `call_id` (`name`: the tool's, for templates that show it)."""
    if name is None:
        return {"role": "tool", "tool_call_id": call_id, "content": content}
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


def tool_calls_of(message: Message) -> list[MessageToolCall]:
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
