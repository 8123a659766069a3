"""Tool calls written as a marker followed by a JSON list of `{"name": ..., "arguments": {...}}`:
Granite 3.x (`<|tool_call|>[...]`, vLLM's `granite`) and Phi-4-mini (`functools[...]`,
vLLM's `phi4_mini_json`). Text before the marker is the turn's content.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from gym_bridge.core.parsers.call import ParsedCall, ParsedTurn, arguments_object, call_from_object, guess_name, to_json


class JsonListParser:
    def __init__(self, name: str, marker: str, *, list_in_marker: bool = False) -> None:
        self.name = name
        self.marker = marker
        self.markers = (marker,)
        self._list_in_marker = list_in_marker
        """The marker ends with the list's `[` (functools[)."""

    def parse(self, text: str, tools: Sequence[Mapping[str, Any]] = ()) -> ParsedTurn:
        at = text.find(self.marker)
        if at < 0:
            return ParsedTurn(reasoning="", content=text.strip())
        body = text[at + len(self.marker) - (1 if self._list_in_marker else 0):].strip()
        try:
            obj, end = json.JSONDecoder().raw_decode(body)
        except json.JSONDecodeError as error:
            call = ParsedCall(name=guess_name(body), arguments=body, error=f"the tool calls are not valid JSON ({error.msg})")
            return ParsedTurn(reasoning="", content=text[:at].strip(), calls=(call,))
        objects = obj if isinstance(obj, list) else [obj]
        calls = tuple(call_from_object(entry, raw=json.dumps(entry)) for entry in objects) or (
            ParsedCall(name="", arguments=body, error="the list of tool calls is empty"),
        )
        return ParsedTurn(reasoning="", content=(text[:at] + body[end:]).strip(), calls=calls)

    def format(self, calls: Sequence[ParsedCall]) -> str:
        entries = ", ".join(f'{{"name": {to_json(call.name)}, "arguments": {to_json(arguments_object(call))}}}' for call in calls)
        prefix = self.marker[:-1] if self._list_in_marker else self.marker
        return f"{prefix}[{entries}]"
