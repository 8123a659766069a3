"""Mistral tool calls after `[TOOL_CALLS]`, in the three shapes Mistral models use:
- a JSON list `[{"name": ..., "arguments": {...}, "id": "abcDEF123"}]` (v3 tokenizers; `id` optional);
- `name[CALL_ID]abcDEF123[ARGS]{...}` or `name[ARGS]{...}` (Mistral Small 3.2 and later);
- `name{...}` (v11 tokenizers).
vLLM's `mistral` parser. Call ids the model wrote are kept; Mistral templates need ids of nine
letters or digits, so gym_bridge makes ids of that form for this family.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from gym_bridge.core.parsers.call import ParsedCall, ParsedTurn, arguments_object, call_from_arguments, parse_json_calls, to_json

_BOT = "[TOOL_CALLS]"


def _named_call(segment: str) -> ParsedCall:
    """`name[CALL_ID]id[ARGS]{...}`, `name[ARGS]{...}` or `name{...}`."""
    call_id = None
    if "[ARGS]" in segment:
        head, _, arguments = segment.partition("[ARGS]")
        name, _, written_id = head.partition("[CALL_ID]")
        call_id = written_id.strip() or None
    else:
        brace = segment.find("{")
        if brace < 0:
            return ParsedCall(name=segment.strip(), arguments="", error="the tool call has no arguments object")
        name, arguments = segment[:brace], segment[brace:]
    name = name.strip()
    if not name:
        return ParsedCall(name="", arguments=arguments, error="the tool call has no name")
    try:
        decoded, end = json.JSONDecoder().raw_decode(arguments.strip())
    except json.JSONDecodeError as error:
        return ParsedCall(name=name, arguments=arguments, error=f"'arguments' is not valid JSON ({error.msg})", call_id=call_id)
    return call_from_arguments(name, decoded, call_id=call_id)


class MistralParser:
    name = "mistral"
    markers = (_BOT,)

    def parse(self, text: str, tools: Sequence[Mapping[str, Any]] = ()) -> ParsedTurn:
        if _BOT not in text:
            return ParsedTurn(reasoning="", content=text.strip())
        content, *segments = text.split(_BOT)
        calls: list[ParsedCall] = []
        for segment in segments:
            segment = segment.strip()
            if segment.startswith("["):
                calls.extend(parse_json_calls(segment))
            elif segment:
                calls.append(_named_call(segment))
        if not calls:
            calls.append(ParsedCall(name="", arguments="", error="[TOOL_CALLS] is followed by no call"))
        return ParsedTurn(reasoning="", content=content.strip(), calls=tuple(calls))

    def format(self, calls: Sequence[ParsedCall]) -> str:
        entries = []
        for call in calls:
            entry = f'{{"name": {to_json(call.name)}, "arguments": {to_json(arguments_object(call))}'
            entries.append(entry + (f', "id": {to_json(call.call_id)}}}' if call.call_id else "}"))
        return f"{_BOT}[{', '.join(entries)}]"
