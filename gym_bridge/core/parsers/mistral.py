"""Mistral tool calls after `[TOOL_CALLS]`, in the three shapes Mistral models use:
- a JSON list `[{"name": ..., "arguments": {...}, "id": "abcDEF123"}]` (v3 tokenizers; `id` optional;
  a single object is read too);
- `name[CALL_ID]abcDEF123[ARGS]{...}` or `name[ARGS]{...}` (Mistral Small 3.2 and later);
- `name{...}` (v11 tokenizers), or a bare `name` (a call without arguments).
vLLM's `mistral` parser, which picks one shape by the tokenizer's version; gym_bridge reads all
three. Text after a call's JSON is content, as is text before a JSON list. Call ids the model wrote
are kept; Mistral templates need ids of nine letters or digits, so gym_bridge makes ids of that
form for this family.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping, Sequence

from gym_bridge.core.parsers.call import ParsedCall, ParsedTurn, arguments_object, call_from_arguments, call_from_object, guess_name, to_json

_BOT = "[TOOL_CALLS]"
_NAME = re.compile(r"[A-Za-z_][\w.\-]*")
_JSON_START = re.compile(r"\[\s*\{|\{\s*\"")
_CALL_ID = "[CALL_ID]"
_ARGS = "[ARGS]"


def _decoded(text: str) -> tuple[Any, str] | json.JSONDecodeError:
    """The first JSON value of `text` and the text after it, or the decoding error."""
    try:
        value, end = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError as error:
        return error
    return value, text[end:]


def _json_calls(body: str) -> tuple[list[ParsedCall], str]:
    """Calls from a JSON list (or one object) at the start of `body`, and the text after it."""
    decoded = _decoded(body)
    if isinstance(decoded, json.JSONDecodeError):
        return [ParsedCall(name=guess_name(body), arguments=body, error=f"the tool calls are not valid JSON ({decoded.msg})")], ""
    value, rest = decoded
    entries = value if isinstance(value, list) else [value]
    if not entries:
        return [ParsedCall(name="", arguments=body, error="the list of tool calls is empty")], rest
    return [call_from_object(entry, raw=json.dumps(entry)) for entry in entries], rest


def _named_call(name: str, call_id: str | None, arguments: str) -> tuple[ParsedCall, str]:
    """`name` with its arguments (the JSON object at the start of `arguments`; none: `{}`), and the text after them."""
    if not arguments.strip():
        return ParsedCall(name=name, arguments="{}", call_id=call_id), ""
    decoded = _decoded(arguments.strip())
    if isinstance(decoded, json.JSONDecodeError):
        return ParsedCall(name=name, arguments=arguments.strip(), error=f"'arguments' is not valid JSON ({decoded.msg})", call_id=call_id), ""
    value, rest = decoded
    return call_from_arguments(name, value, call_id=call_id), rest


def _segment(segment: str) -> tuple[list[ParsedCall], str]:
    """The calls of the text after one `[TOOL_CALLS]`, and the text around them that is content."""
    body = segment.strip()
    if body.startswith(("[", "{")):
        return _json_calls(body)
    if _ARGS in body:
        head, _, arguments = body.partition(_ARGS)
        name, _, written_id = head.partition(_CALL_ID)
        call, rest = _named_call(name.strip(), written_id.strip() or None, arguments)
        return [call] if call.name else [ParsedCall(name="", arguments=body, error="the tool call has no name")], rest
    name = _NAME.match(body)
    if name and (body[name.end():].lstrip().startswith("{") or not body[name.end():].strip()):
        call, rest = _named_call(name.group(0), None, body[name.end():])
        return [call], rest
    start = _JSON_START.search(body)
    if start:  # text the model wrote before its JSON list
        calls, rest = _json_calls(body[start.start():])
        return calls, f"{body[:start.start()].strip()} {rest.strip()}"
    return [ParsedCall(name="", arguments=body, error="[TOOL_CALLS] is followed by neither a JSON list of calls nor name{arguments}")], ""


class MistralParser:
    name = "mistral"
    markers = (_BOT,)

    def parse(self, text: str, tools: Sequence[Mapping[str, Any]] = ()) -> ParsedTurn:
        if _BOT not in text:
            return ParsedTurn(reasoning="", content=text.strip())
        content, *segments = text.split(_BOT)
        calls: list[ParsedCall] = []
        prose = [content.strip()]
        for segment in segments:
            if segment.strip():
                found, rest = _segment(segment)
                calls.extend(found)
                prose.append(rest.strip())
        if not calls:
            calls.append(ParsedCall(name="", arguments="", error="[TOOL_CALLS] is followed by no call"))
        return ParsedTurn(reasoning="", content=" ".join(piece for piece in prose if piece), calls=tuple(calls))

    def format(self, calls: Sequence[ParsedCall]) -> str:
        entries = []
        for call in calls:
            entry = f'{{"name": {to_json(call.name)}, "arguments": {to_json(arguments_object(call))}'
            entries.append(entry + (f', "id": {to_json(call.call_id)}}}' if call.call_id else "}"))
        return f"{_BOT}[{', '.join(entries)}]"
