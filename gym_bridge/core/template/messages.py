"""The chat messages a template is given for what a rollout produced: tool outputs and recorded turns.

`tool_messages` turns the environment's tool results into tool messages; `conversation` reads a
record's trajectory items back as the assistant and tool messages the template was given, so that
rendering the task's messages plus these gives the next call's prompt (for append-only templates).
It sees a template only as a `TurnTemplate`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gym_bridge.core.conversation import TemplateMessage
from gym_bridge.core.items import item_text
from gym_bridge.core.turn import ToolCall, Turn


@dataclass(frozen=True)
class ToolOutput:
    """One tool result to render for the model."""

    name: str
    content: str
    call_id: str


class TurnTemplate(Protocol):
    """What reading turns back needs of a chat template (`gym_bridge.core.template.chat_template.ChatTemplate` is one)."""

    eos_token_ids: frozenset[int]

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def template_message(self, turn: Turn, *, call_ids: Sequence[str], raw_text: str) -> TemplateMessage: ...


def tool_messages(outputs: Sequence[ToolOutput]) -> list[TemplateMessage]:
    """The tool messages of `outputs`, in order."""
    return [{"role": "tool", "name": out.name, "content": out.content, "tool_call_id": out.call_id} for out in outputs]


def conversation(template: TurnTemplate, output: Sequence[Mapping[str, Any]]) -> list[TemplateMessage]:
    """A trajectory's items (a record's `response.output`) as the chat messages `template` is given: one
    assistant message per model call (from its items and, for templates given raw turns, its sampled ids),
    one tool message per tool output, one user message per user message the environment added."""
    messages: list[TemplateMessage] = []
    names: dict[str, str] = {}
    reasoning: list[str] = []
    content: list[str] = []
    calls: list[ToolCall] = []
    for item in output:
        kind = item.get("type")
        if kind == "reasoning":
            reasoning.append(item_text(item))
        elif kind == "message" and item.get("role") == "user":
            messages.append({"role": "user", "content": item_text(item)})
        elif kind == "message":
            content.append(item_text(item))
        elif kind == "function_call":
            calls.append(ToolCall(name=item["name"], arguments=item["arguments"], id=item["call_id"]))
            names[item["call_id"]] = item["name"]
        elif kind == "function_call_output":
            messages.append({"role": "tool", "name": names.get(item["call_id"], ""), "content": item["output"],
                             "tool_call_id": item["call_id"]})
        if "generation_token_ids" in item:  # the last item of a model call
            ids = list(item["generation_token_ids"])
            raw = template.decode(ids[:-1] if ids and ids[-1] in template.eos_token_ids else ids)
            turn = Turn(reasoning="\n".join(reasoning), text="".join(content), calls=tuple(calls))
            messages.append(template.template_message(turn, call_ids=[call.id or "" for call in calls], raw_text=raw))
            reasoning, content, calls = [], [], []
    return messages
