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
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from gym_bridge.core.template.parsers.call import arguments_object, call_from_arguments, call_from_object, guess_name, to_json
from gym_bridge.core.turn import ToolCall, Turn

_BOT = "[TOOL_CALLS]"
_NAME = re.compile(r"[A-Za-z_][\w.\-]*")
_JSON_START = re.compile(r"\[\s*\{|\{\s*\"")
_CALL_ID = "[CALL_ID]"
_ARGS = "[ARGS]"


@dataclass(frozen=True)
class _Read:
    """What follows one `[TOOL_CALLS]`: its calls, and the text beside them that is content."""

    calls: tuple[ToolCall, ...]
    text: str = ""


def _json_calls(body: str, *, before: str = "") -> _Read:
    """Calls from a JSON list (or one object) at the start of `body`; `before`: text the model wrote ahead of it."""
    try:
        value, end = json.JSONDecoder().raw_decode(body)
    except json.JSONDecodeError as error:
        return _Read((ToolCall(name=guess_name(body), arguments=body, error=f"the tool calls are not valid JSON ({error.msg})"),), before)
    entries = value if isinstance(value, list) else [value]
    calls = tuple(call_from_object(entry, raw=json.dumps(entry)) for entry in entries)
    text = f"{before} {body[end:].strip()}".strip()
    return _Read(calls or (ToolCall(name="", arguments=body, error="the list of tool calls is empty"),), text)


def _named_call(name: str, arguments: str, *, call_id: str | None = None) -> _Read:
    """`name` with the JSON object at the start of `arguments` (none written: `{}`)."""
    if not name:
        return _Read((ToolCall(name="", arguments=arguments, error="the tool call has no name"),))
    if not arguments.strip():
        return _Read((ToolCall(name=name, arguments="{}", id=call_id),))
    try:
        value, end = json.JSONDecoder().raw_decode(arguments.strip())
    except json.JSONDecodeError as error:
        return _Read((ToolCall(name=name, arguments=arguments.strip(), error=f"'arguments' is not valid JSON ({error.msg})", id=call_id),))
    return _Read((call_from_arguments(name, value, call_id=call_id),), arguments.strip()[end:].strip())


def _read(after_marker: str) -> _Read:
    body = after_marker.strip()
    if body.startswith(("[", "{")):
        return _json_calls(body)
    if _ARGS in body:
        head, _, arguments = body.partition(_ARGS)
        name, _, written_id = head.partition(_CALL_ID)
        return _named_call(name.strip(), arguments, call_id=written_id.strip() or None)
    bare_name = _NAME.match(body)
    after = body[bare_name.end():] if bare_name else ""
    if bare_name and (not after.strip() or after.lstrip().startswith("{")):
        return _named_call(bare_name.group(0), after)
    start = _JSON_START.search(body)
    if start:
        return _json_calls(body[start.start():], before=body[:start.start()].strip())
    return _Read((ToolCall(name="", arguments=body, error="[TOOL_CALLS] is followed by neither a JSON list of calls nor name{arguments}"),))


class MistralParser:
    name = "mistral"
    markers = (_BOT,)

    def parse(self, text: str, tools: Sequence[Mapping[str, Any]] = ()) -> Turn:
        if _BOT not in text:
            return Turn(reasoning="", text=text.strip())
        content, *after_markers = text.split(_BOT)
        reads = [_read(after) for after in after_markers if after.strip()]
        calls = [call for read in reads for call in read.calls]
        prose = [content.strip(), *(read.text for read in reads)]
        if not calls:
            calls.append(ToolCall(name="", arguments="", error="[TOOL_CALLS] is followed by no call"))
        return Turn(reasoning="", text=" ".join(piece for piece in prose if piece), calls=tuple(calls))

    def format(self, calls: Sequence[ToolCall]) -> str:
        entries = []
        for call in calls:
            entry = f'{{"name": {to_json(call.name)}, "arguments": {to_json(arguments_object(call))}'
            entries.append(entry + (f', "id": {to_json(call.id)}}}' if call.id else "}"))
        return f"{_BOT}[{', '.join(entries)}]"
