"""Environment deltas: the text appended after a sampled turn, planned once per shape of new messages.

A delta is the rest of the turn's closing, the new tool or user messages and the next generation
prompt. Each shape (roles and tool names) is rendered once on a probe conversation with marked
contents; where every mark appears once, the delta is later built by joining the fixed pieces
around the messages' fields (as written, JSON-escaped or trimmed, whichever the template does),
else it is rendered every time. It sees a template only as a `DeltaTemplate`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gym_bridge.core.conversation import TemplateMessage
from gym_bridge.core.errors import TemplateError
from gym_bridge.core.template.profile import PROBE_TOOLS, PROBE_USER, Renderer, TemplateProfile, first_end, short_call_id
from gym_bridge.core.turn import ToolCall, Turn

_SENTINEL = "\u2063GYMBRIDGE_ASSISTANT\u2063"
_PROBE_ANSWER = "\u2063GYMBRIDGE_ANSWER\u2063"
_SAMPLES = (' {"a": [1, 2]}\n\tb ', "<x> & 'q' \u00e9\\n\n")
"""Contents that tell whether a template passes text through untouched, JSON-escaped or trimmed."""
_TRANSFORMS: tuple[Callable[[str], str] | None, ...] = (None, lambda text: json.dumps(text, ensure_ascii=False)[1:-1], str.strip)
_NO_TRANSFORM: Any = object()
"""`_transform`'s answer when the template writes a content in none of the `_TRANSFORMS` ways."""

Slot = tuple[int, str, Callable[[str], str] | None]
"""Where a message's field goes in a delta: the message's index, the field's name, how the template writes it."""


class DeltaTemplate(Renderer, Protocol):
    """What delta planning needs of a chat template (`gym_bridge.core.template.chat_template.ChatTemplate` is one):
    profiling's `Renderer`, the profile it found, and the assistant message of a turn."""

    @property
    def profile(self) -> TemplateProfile: ...

    def template_message(self, turn: Turn, *, call_ids: Sequence[str], raw_text: str) -> TemplateMessage: ...


@dataclass(frozen=True)
class DeltaPlan:
    """How to build one delta shape: by joining fixed pieces around the messages' fields
    (`slots`: message index, field, transform), or (pieces None) by rendering every time."""

    structured: bool
    """The probe's previous turn was structured (else a plain message holding a sentinel)."""
    pieces: tuple[str, ...] | None
    slots: tuple[Slot, ...] = ()

    def join(self, messages: Sequence[Mapping[str, Any]]) -> str:
        assert self.pieces is not None
        out = [self.pieces[0]]
        for (index, name, transform), piece in zip(self.slots, self.pieces[1:]):
            value = messages[index][name]
            out.append(value if transform is None else transform(value))
            out.append(piece)
        return "".join(out)


class DeltaPlanner:
    """The deltas of one template, each shape planned once (`plans`)."""

    def __init__(self, template: DeltaTemplate) -> None:
        self.template = template
        self.plans: dict[tuple[tuple[str, str], ...], DeltaPlan] = {}
        """The plan of each shape seen: the (role, name) of each new message."""
        self._probe_head: str | None = None

    def text(self, new_messages: Sequence[Mapping[str, Any]], *, closing_sampled: str) -> str:
        """The text to append after a sampled turn for `new_messages` (tool or user messages):
        the rest of the turn's closing, the messages and the next generation prompt."""
        key = tuple((m["role"], m.get("name", "")) for m in new_messages)
        plan = self.plans.get(key)
        if plan is None:
            plan = self.plans[key] = self._plan(new_messages)
        after = plan.join(new_messages) if plan.pieces is not None else self.render(new_messages, structured=plan.structured)
        if closing_sampled and after.startswith(closing_sampled):
            after = after[len(closing_sampled):]
        return after

    def render(self, new_messages: Sequence[Mapping[str, Any]], *, structured: bool) -> str:
        """The text after the previous turn's sampled text, starting with that turn's closing.

        `structured`: the previous turn is given as a chat server would give it and the delta
        starts at the first end-of-turn marker after it; else it is a plain message holding a
        sentinel and the delta starts right after the sentinel.
        """
        template, tools = self.template, list(PROBE_TOOLS)
        if structured:
            if self._probe_head is None:
                self._probe_head = template.render([PROBE_USER], tools=tools, add_generation_prompt=True)
            head = self._probe_head
            full = template.render([PROBE_USER, self._previous_turn(new_messages), *new_messages], tools=tools, add_generation_prompt=True)
            start = len(os.path.commonprefix([head, full]))
            end = first_end(full[start:], template.end_texts)
            if end is None:
                raise TemplateError("no end-of-turn marker after the assistant turn")
            return full[start + end[0]:]
        probe = [PROBE_USER, {"role": "assistant", "content": _SENTINEL}, *new_messages]
        text = template.render(probe, tools=tools, add_generation_prompt=True)
        return text[text.index(_SENTINEL) + len(_SENTINEL):]

    def _previous_turn(self, new_messages: Sequence[Mapping[str, Any]]) -> TemplateMessage:
        """The probe's assistant turn before `new_messages`: calls answered by the tool messages among them."""
        calls = [ToolCall(name=m.get("name", ""), arguments="{}") for m in new_messages if m["role"] == "tool"]
        ids = [m.get("tool_call_id", "") for m in new_messages if m["role"] == "tool"]
        turn = Turn(reasoning="", text="" if calls else _PROBE_ANSWER, calls=tuple(calls))
        raw = self.template.profile.parser.format(turn.calls) if calls else _PROBE_ANSWER
        return self.template.template_message(turn, call_ids=ids, raw_text=raw)

    def _plan(self, new_messages: Sequence[Mapping[str, Any]]) -> DeltaPlan:
        marks = [dict(m, content=f"\u2063GB{i}\u2063") for i, m in enumerate(new_messages)]
        for i, mark in enumerate(marks):
            if mark["role"] == "tool":
                mark["tool_call_id"] = short_call_id(f"mark{i}") if self.template.profile.style.short_ids else f"call_GBMARK{i}"
        structured = True
        try:
            text = self.render(marks, structured=True)
            if any(m["content"] not in text for m in marks):
                raise TemplateError("a message's content is missing from the structured delta")
        except TemplateError:
            structured = False
            text = self.render(marks, structured=False)  # raises TemplateError when neither works
        found: list[tuple[int, int, int, str]] = []
        for index, mark in enumerate(marks):
            for name in ("content", "tool_call_id"):
                value = mark.get(name)
                if not value or value not in text:
                    continue
                if text.count(value) != 1:
                    return DeltaPlan(structured=structured, pieces=None)
                found.append((text.index(value), len(value), index, name))
        found.sort()
        pieces: list[str] = []
        slots: list[Slot] = []
        at = 0
        for position, length, index, name in found:
            pieces.append(text[at:position])
            slots.append((index, name, None))
            at = position + length
        pieces.append(text[at:])
        plan = DeltaPlan(structured=structured, pieces=tuple(pieces), slots=tuple(slots))
        for slot_number, (index, name, _) in enumerate(slots):
            if name != "content":
                continue
            transform = self._transform(plan, marks, slot_number, index)
            if transform is _NO_TRANSFORM:
                return DeltaPlan(structured=structured, pieces=None)
            slots[slot_number] = (index, name, transform)
            plan = DeltaPlan(structured=structured, pieces=tuple(pieces), slots=tuple(slots))
        return plan

    def _transform(self, plan: DeltaPlan, marks: list[TemplateMessage], slot_number: int, index: int) -> Any:
        """How the template writes the content of message `index` (unchanged, JSON-escaped or
        trimmed); `_NO_TRANSFORM` when it does something else."""
        candidates = list(_TRANSFORMS)
        for sample in _SAMPLES:
            trial = [dict(m, content=sample) if i == index else m for i, m in enumerate(marks)]
            rendered = self.render(trial, structured=plan.structured)
            candidates = [
                transform for transform in candidates
                if DeltaPlan(plan.structured, plan.pieces, tuple(
                    (i, n, transform if number == slot_number else t) for number, (i, n, t) in enumerate(plan.slots)
                )).join(trial) == rendered
            ]
        return candidates[0] if candidates else _NO_TRANSFORM
