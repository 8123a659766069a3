"""Tool calls written as a marker followed by a JSON list of `{"name": ..., "arguments": {...}}`:
Granite 3.0 (`<|tool_call|>[...]`) and 3.1 (`<tool_call> [...]`, plain text), vLLM's `granite`;
Phi-4-mini (`functools[...]`, vLLM's `phi4_mini_json`). Text before the marker and after the
list is the turn's content. As in vLLM, only a list is read: a single object after a special-token
marker is an error call the model is told about (a plain-text marker, `<tool_call>`, shared with
Hermes, counts only when a list follows it), and under `require_arguments` (phi4_mini_json) a list
with an entry lacking `name` or `arguments`/`parameters` makes every call of the turn an error call,
since vLLM then reads none of them. Training never rewards a call the serving engine would not parse.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping, Sequence

from gym_bridge.core.template.parsers.call import arguments_object, call_from_object, guess_name, to_json
from gym_bridge.core.turn import ToolCall, Turn


class JsonListParser:
    def __init__(self, name: str, marker: str, *, list_in_marker: bool = False, text_marker: str | None = None,
                 require_arguments: bool = False) -> None:
        self.name = name
        self._require_arguments = require_arguments
        self.marker = marker
        self.markers = (marker,) if text_marker is None else (marker, text_marker)
        self._list_in_marker = list_in_marker
        """The marker ends with the list's `[` (functools[)."""
        self._opening = re.compile(re.escape(marker) + ("" if text_marker is None else "|" + re.escape(text_marker) + r"(?=\s*\[)"))
        """The first marker; a text marker only where a list follows it."""

    def parse(self, text: str, tools: Sequence[Mapping[str, Any]] = ()) -> Turn:
        opening = self._opening.search(text)
        if opening is None:
            return Turn(reasoning="", text=text.strip())
        at = opening.start()
        body = text[opening.end() - (1 if self._list_in_marker else 0):].strip()
        try:
            obj, end = json.JSONDecoder().raw_decode(body)
        except json.JSONDecodeError as error:
            call = ToolCall(name=guess_name(body), arguments=body, error=f"the tool calls are not valid JSON ({error.msg})")
            return Turn(reasoning="", text=text[:at].strip(), calls=(call,))
        content_before = text[:at].strip()
        if not isinstance(obj, list):
            call = ToolCall(name=guess_name(body), arguments=body[:end],
                              error=f"the tool calls after {self.marker} must be a JSON list: [{{\"name\": ..., \"arguments\": {{...}}}}]")
            return Turn(reasoning="", text=" ".join(piece for piece in (content_before, body[end:].strip()) if piece), calls=(call,))
        calls = tuple(call_from_object(entry, raw=json.dumps(entry)) for entry in obj) or (
            ToolCall(name="", arguments=body, error="the list of tool calls is empty"),
        )
        if self._require_arguments and not all(_complete(entry) for entry in obj):
            reason = "every tool call needs a 'name' and 'arguments'; one lacks them, so none of this turn's calls is read"
            calls = tuple(ToolCall(name=call.name, arguments=call.arguments, error=call.error or reason) for call in calls)
        content = " ".join(piece for piece in (content_before, body[end:].strip()) if piece)
        return Turn(reasoning="", text=content, calls=calls)

    def format(self, calls: Sequence[ToolCall]) -> str:
        entries = ", ".join(f'{{"name": {to_json(call.name)}, "arguments": {to_json(arguments_object(call))}}}' for call in calls)
        prefix = self.marker[:-1] if self._list_in_marker else self.marker
        return f"{prefix}[{entries}]"


def _complete(entry: Any) -> bool:
    return isinstance(entry, dict) and isinstance(entry.get("name"), str) and ("arguments" in entry or "parameters" in entry)
