"""The chat template's view of a conversation: messages and tool schemas as a template is given them.

A chat-completions request's messages become the chat messages gym_bridge's `ChatTemplate`
renders (`template_messages`): tool calls written the way the model writes them for templates
without tool support, arguments as objects otherwise. Tool schemas reach a template in the
chat-completions JSON-schema shape (`to_template_tool`), the form transformers passes to
`apply_chat_template(tools=...)`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from gym_bridge.core.dialects.chat import MessageIn, to_chat_tool, tool_call_arguments
from gym_bridge.core.conversation import Message, TemplateMessage


def to_template_tool(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A Responses function schema in the shape chat templates expect (that of a chat-completions tool)."""
    return to_chat_tool(schema)


def template_messages(messages: Sequence[MessageIn], *, tool_format: str) -> list[TemplateMessage]:
    """Chat-completions messages as gym_bridge's template renders them: `developer` as `system`,
    tool messages with their name and id, and tool calls written the way the model writes them
    (Hermes text for `tool_format` "hermes_system"), arguments as objects otherwise.

    Raises ApiError 400 for tool call arguments that are not a JSON object.
    """
    rendered: list[TemplateMessage] = []
    for message in messages:
        role = "system" if message.role == "developer" else message.role
        entry: dict[str, Any] = {"role": role, "content": message.text()}
        if message.role == "tool":
            entry["name"] = message.name or ""
            entry["tool_call_id"] = message.tool_call_id or ""
        if message.tool_calls:
            calls = [{"name": call.function.name, "arguments": tool_call_arguments(call.function.arguments)} for call in message.tool_calls]
            if tool_format == "hermes_system":
                written = "\n".join(f"<tool_call>\n{json.dumps(call)}\n</tool_call>" for call in calls)
                entry["content"] = f"{entry['content']}\n{written}" if entry["content"] else written
            else:
                entry["tool_calls"] = [{"id": call.id, "type": "function", "function": parsed}
                                       for call, parsed in zip(message.tool_calls, calls)]
        rendered.append(entry)
    return rendered


def task_template_messages(messages: Sequence[Message]) -> Sequence[Message] | list[TemplateMessage]:
    """A task's messages as a template is given them: tool call arguments as objects (what
    `apply_chat_template` expects); the messages themselves when none calls a tool (the common case, free).

    Raises ApiError 400 for tool call arguments that are not a JSON object.
    """
    for message in messages:  # a loop, not any() over a generator: this runs for every rollout's first prompt
        if "tool_calls" in message:
            break
    else:
        return messages
    rendered: list[TemplateMessage] = []
    for message in messages:
        entry: TemplateMessage = dict(message)
        if message["role"] == "assistant" and message.get("tool_calls"):
            entry["content"] = message["content"] or ""  # as a task's calls always reached the template
            entry["tool_calls"] = [{"id": call["id"], "type": "function", "function": {
                "name": call["function"]["name"], "arguments": tool_call_arguments(call["function"]["arguments"])}}
                for call in message["tool_calls"]]
        rendered.append(entry)
    return rendered
