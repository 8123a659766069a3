"""Llama 3.x JSON tool calls: `{"name": ..., "parameters": {...}}` objects, after an optional
`<|python_tag|>`, one or several (separated by `;`, by newlines or in a JSON list; `arguments`
accepted for `parameters`, a ```json fence tolerated). vLLM's `llama3_json` parser: as there, a
call object is found anywhere in the turn, also between sentences of prose; the prose is the
turn's content. JSON that is not a call object stays text; a `{"name": ...` that does not decode
is a malformed call.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from gym_bridge.core.template.parsers.call import arguments_object, call_from_object, guess_name, to_json
from gym_bridge.core.turn import ToolCall, Turn

_PYTHON_TAG = "<|python_tag|>"
_CALL_START = re.compile(r'\{\s*"name"\s*:')
_OBJECT_START = re.compile(r'\{\s*["}]')
"""Where a JSON object can start (code's braces are passed over without decoding)."""
_SEPARATORS = " \t\r\n;,[]`"
"""What may stand between calls (list brackets, `;`, fences) without being content."""


def _is_call(obj: Any) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get("name"), str) and ("arguments" in obj or "parameters" in obj)


@dataclass(frozen=True)
class JsonCalls:
    calls: tuple[ToolCall, ...]
    prose: tuple[str, ...]
    """The text around the calls, piece by piece (separators and fences removed)."""


def find_json_calls(text: str) -> JsonCalls:
    """The call objects written anywhere in `text`, and the prose around them. A call that
    starts `{"name":` but does not decode takes the rest of the text as its (malformed) body."""
    decoder = json.JSONDecoder()
    calls: list[ToolCall] = []
    pieces: list[str] = []
    position = cursor = 0
    while (start := _OBJECT_START.search(text, cursor)) is not None:
        brace = start.start()
        try:
            obj, end = decoder.raw_decode(text, brace)
        except json.JSONDecodeError as error:
            if not _CALL_START.match(text, brace):
                cursor = brace + 1
                continue
            body = text[brace:].strip()
            pieces.append(text[position:brace])
            calls.append(ToolCall(name=guess_name(body), arguments=body, error=f"the tool call is not valid JSON ({error.msg})"))
            position = len(text)
            break
        if _is_call(obj):
            pieces.append(text[position:brace])
            calls.append(call_from_object(obj, raw=text[brace:end]))
            position = end
        cursor = end
    pieces.append(text[position:])
    return JsonCalls(calls=tuple(calls), prose=tuple(piece for piece in map(_prose, pieces) if piece))


def _prose(piece: str) -> str:
    text = piece.replace(_PYTHON_TAG, "").strip(_SEPARATORS)
    return "" if text.lower() == "json" else text  # the label of a ```json fence


class Llama3JsonParser:
    name = "llama3_json"
    markers = (_PYTHON_TAG, '{"name"')

    def parse(self, text: str, tools: Sequence[Mapping[str, Any]] = ()) -> Turn:
        found = find_json_calls(text)
        if not found.calls:
            return Turn(reasoning="", text=text.strip())
        return Turn(reasoning="", text=" ".join(found.prose), calls=found.calls)

    def format(self, calls: Sequence[ToolCall]) -> str:
        return "; ".join(f'{{"name": {to_json(call.name)}, "parameters": {to_json(arguments_object(call))}}}' for call in calls)
