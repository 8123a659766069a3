"""Llama 3.x JSON tool calls: an optional `<|python_tag|>`, then the whole turn is
`{"name": ..., "parameters": {...}}` (several separated by `;`, or a JSON list; `arguments`
accepted for `parameters`, a ```json fence tolerated). vLLM's `llama3_json` parser.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping, Sequence

from gym_bridge.core.parsers.call import ParsedCall, ParsedTurn, arguments_object, call_from_object, guess_name, to_json

_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"


def _is_call(obj: Any) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get("name"), str) and ("arguments" in obj or "parameters" in obj)


def parse_json_turn(text: str, *, tagged: bool = False) -> tuple[ParsedCall, ...] | None:
    """Calls when the whole of `text` is one or more JSON call objects; None when it is not
    meant as a call (an answer that happens to be JSON). A `{"name": ...` start that does not
    decode, or a `tagged` body, is a malformed call rather than an answer."""
    body = text.strip()
    fence = _FENCE.match(body)
    if fence:
        body = fence.group(1)
    if not body.startswith(("{", "[")):
        return None
    decoder = json.JSONDecoder()
    objects: list[Any] = []
    rest = body
    try:
        while rest:
            obj, end = decoder.raw_decode(rest)
            objects.extend(obj if isinstance(obj, list) else [obj])
            rest = rest[end:].lstrip().removeprefix(";").lstrip()
    except json.JSONDecodeError as error:
        if tagged or (body.startswith("{") and '"name"' in body):
            return (ParsedCall(name=guess_name(body), arguments=body, error=f"the tool call is not valid JSON ({error.msg})"),)
        return None
    if objects and all(_is_call(obj) for obj in objects):
        return tuple(call_from_object(obj, raw=json.dumps(obj)) for obj in objects)
    return None


class Llama3JsonParser:
    name = "llama3_json"
    markers = (_PYTHON_TAG, "{")

    def parse(self, text: str, tools: Sequence[Mapping[str, Any]] = ()) -> ParsedTurn:
        body = text.strip()
        tagged = body.startswith(_PYTHON_TAG)
        if tagged:
            body = body[len(_PYTHON_TAG):]
        if tagged or body[:1] in ("{", "[", "`"):
            calls = parse_json_turn(body, tagged=tagged)
            if calls is not None:
                return ParsedTurn(reasoning="", content="", calls=calls)
        return ParsedTurn(reasoning="", content=text.strip())

    def format(self, calls: Sequence[ParsedCall]) -> str:
        return "; ".join(f'{{"name": {to_json(call.name)}, "parameters": {to_json(arguments_object(call))}}}' for call in calls)
