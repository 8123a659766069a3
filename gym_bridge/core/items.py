"""OpenAI Responses-format items: the wire format of trajectories.

A trajectory is a list of items (`message`, `reasoning`, `function_call`,
`function_call_output`) exactly as the Responses API and NeMo Gym write them, so records are
plain dicts that serialize without conversion. This module builds those dicts and turns task
input (a string, chat messages, or Responses items) into chat messages for the chat template.
"""

from __future__ import annotations

import json
from typing import Any, Literal, NotRequired, TypedDict


class OutputText(TypedDict):
    type: Literal["output_text"]
    text: str
    annotations: list[Any]


class MessageItem(TypedDict):
    type: Literal["message"]
    id: str
    role: Literal["assistant"]
    status: str
    content: list[OutputText]
    prompt_token_ids: NotRequired[list[int]]
    generation_token_ids: NotRequired[list[int]]
    generation_log_probs: NotRequired[list[float]]


class InputText(TypedDict):
    type: Literal["input_text"]
    text: str


class UserMessageItem(TypedDict):
    """A user turn inside the trajectory (a simulated user's reply), as a Responses input message."""

    type: Literal["message"]
    id: str
    role: Literal["user"]
    status: str
    content: list[InputText]


class ReasoningItem(TypedDict):
    type: Literal["reasoning"]
    id: str
    summary: list[dict[str, str]]
    prompt_token_ids: NotRequired[list[int]]
    generation_token_ids: NotRequired[list[int]]
    generation_log_probs: NotRequired[list[float]]


class FunctionCallItem(TypedDict):
    type: Literal["function_call"]
    id: str
    call_id: str
    name: str
    arguments: str
    status: str
    prompt_token_ids: NotRequired[list[int]]
    generation_token_ids: NotRequired[list[int]]
    generation_log_probs: NotRequired[list[float]]


class FunctionCallOutputItem(TypedDict):
    type: Literal["function_call_output"]
    call_id: str
    output: str


Item = MessageItem | UserMessageItem | ReasoningItem | FunctionCallItem | FunctionCallOutputItem

TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


def message_item(text: str, *, item_id: str) -> MessageItem:
    return {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def user_message_item(text: str, *, item_id: str) -> UserMessageItem:
    return {"type": "message", "id": item_id, "role": "user", "status": "completed", "content": [{"type": "input_text", "text": text}]}


def reasoning_item(text: str, *, item_id: str) -> ReasoningItem:
    return {"type": "reasoning", "id": item_id, "summary": [{"type": "summary_text", "text": text}]}


def function_call_item(name: str, arguments: str, *, call_id: str, item_id: str) -> FunctionCallItem:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": "completed",
    }


def function_call_output_item(output: str, *, call_id: str) -> FunctionCallOutputItem:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def item_text(item: dict[str, Any]) -> str:
    """The text of a message or reasoning item ('' for other items)."""
    if item.get("type") == "reasoning":
        return "".join(part.get("text", "") for part in item.get("summary", []))
    content = item.get("content", "")
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


def final_text(output: list[Item]) -> str:
    """The text of the last assistant message of a trajectory ('' if it has none)."""
    for item in reversed(output):
        if item["type"] == "message" and item.get("role", "assistant") == "assistant":
            return item_text(item)
    return ""


def output_text(output: list[Item]) -> str:
    """The text of every assistant message of a trajectory, joined (the Responses API's
    `output_text`; reasoning items are not included)."""
    return "".join(item_text(item) for item in output if item["type"] == "message")  # type: ignore[arg-type]


ChatMessage = dict[str, Any]
_ROLE_TO_CHAT = {"developer": "system", "system": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


def to_chat_messages(task_input: str | list[dict[str, Any]]) -> list[ChatMessage]:
    """Chat messages (`role`, `content`) for a Responses `input` (string, messages or items).

    Raises ValueError naming the offending entry when an entry is neither a message nor a
    known item.
    """
    if isinstance(task_input, str):
        return [{"role": "user", "content": task_input}]
    messages: list[ChatMessage] = []
    for position, entry in enumerate(task_input):
        kind = entry.get("type", "message")
        if kind == "message" and "role" in entry:
            role = _ROLE_TO_CHAT.get(entry["role"])
            if role is None:
                raise ValueError(f"input[{position}].role: unknown role {entry['role']!r}")
            messages.append({"role": role, "content": item_text(entry)})
        elif kind == "function_call":
            call = {"name": entry["name"], "arguments": json.loads(entry.get("arguments") or "{}")}
            messages.append({"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": call}]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "content": str(entry.get("output", ""))})
        elif kind == "reasoning":
            continue
        else:
            raise ValueError(f"input[{position}]: expected a message or a Responses item, got type {kind!r}")
    return messages
