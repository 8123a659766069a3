"""The Responses dialect: the text of an item, and Responses items <-> chat messages.

Trajectories and task inputs are Responses items (`message`, `reasoning`, `function_call`,
`function_call_output`); chat messages are the internal form the agent loop and the chat
template work on. This module reads items (`item_text`; a trajectory's answer: `final_text`,
`output_text`), turns a Responses `input` into chat
messages (`to_chat_messages`) and chat messages back into Responses input items
(`from_chat_messages`, what the Responses API is sent).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_ROLE_TO_CHAT = {"developer": "system", "system": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


def item_text(item: Mapping[str, Any]) -> str:
    """The text of a message or reasoning item: its content parts' (or summary parts') texts
    joined, a string content as it is, '' for other items."""
    if item.get("type") == "reasoning":
        return "".join(part.get("text", "") for part in item.get("summary", []))
    content = item.get("content", "")
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [] if isinstance(part, Mapping))


def final_text(output: Sequence[Mapping[str, Any]]) -> str:
    """The text of the last assistant message of a trajectory ('' if it has none)."""
    for item in reversed(output):
        if item["type"] == "message" and item.get("role", "assistant") == "assistant":
            return item_text(item)
    return ""


def output_text(output: Sequence[Mapping[str, Any]]) -> str:
    """The text of every assistant message of a trajectory, joined (the Responses API's
    `output_text`; reasoning items are not included)."""
    return "".join(item_text(item) for item in output if item["type"] == "message")


def to_chat_messages(task_input: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages (`role`, `content`) for a Responses `input` (string, messages or items):
    a `function_call` becomes an assistant message with one tool call (arguments parsed), a
    `function_call_output` a tool message; reasoning items are left out.

    Raises ValueError naming the offending entry when an entry is neither a message nor a
    known item.
    """
    if isinstance(task_input, str):
        return [{"role": "user", "content": task_input}]
    messages: list[dict[str, Any]] = []
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


def from_chat_messages(messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages as Responses input items: a message per non-empty content, a `function_call`
    per tool call (its id and arguments string as given) and a `function_call_output` per tool message."""
    items: list[dict[str, Any]] = []
    for message in messages:
        role = message["role"]
        if role == "tool":
            items.append({"type": "function_call_output", "call_id": message.get("tool_call_id", ""), "output": message.get("content", "")})
            continue
        if message.get("content"):
            items.append({"type": "message", "role": role, "content": message["content"]})
        for call in message.get("tool_calls") or []:
            function = call["function"]
            items.append({"type": "function_call", "call_id": call["id"], "name": function["name"], "arguments": function["arguments"]})
    return items


def to_responses_tool(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A function schema (`name`, `description`, `parameters`) as a Responses `tools` entry."""
    return {"type": "function", "name": schema["name"], "description": schema.get("description", ""),
            "parameters": schema.get("parameters") or {"type": "object", "properties": {}}}
