"""The tool parser protocol, and the JSON helpers every tool-call syntax shares.

A tool parser reads the text of one model turn into a `Turn` (`gym_bridge.core.turn`): its `text` outside call
markup and its `ToolCall`s; a call that cannot be read keeps an `error` so the model is told what was wrong
instead of its text being taken silently as an answer. `CALL_MARKERS` are the openings of every
known call syntax: a turn without calls that contains one is counted as an unparsed tool call.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping, Protocol, Sequence

from gym_bridge.core.turn import ToolCall, Turn


class ToolParser(Protocol):
    """Reads and writes one family's tool-call syntax."""

    @property
    def name(self) -> str:
        """The parser's name, as vLLM names it."""
        ...

    @property
    def markers(self) -> tuple[str, ...]:
        """Substrings that open a call in this syntax (a cheap test before any regex)."""
        ...

    def parse(self, text: str, tools: Sequence[Mapping[str, Any]] = ()) -> Turn:
        """Content and calls of `text` (reasoning already split off); `tools` are the offered
        Responses function schemas, for syntaxes whose argument values carry no types."""
        ...

    def format(self, calls: Sequence[ToolCall]) -> str:
        """The calls written as the model writes them (without the end-of-turn token)."""
        ...


CALL_MARKERS = (
    "<tool_call>", "[TOOL_CALLS]", "<\uff5ctool\u2581calls\u2581begin\uff5c>", "<\uff5ctool\u2581call\u2581begin\uff5c>",
    "<|tool_call|>", "functools[", "<|python_tag|>", "to=functions.", "<function=",
)
_NAME = re.compile(r'"name"\s*:\s*"([^"]+)"')


def looks_like_call(text: str) -> bool:
    """Whether `text` holds a known tool-call marker or is a bare JSON call object."""
    if any(marker in text for marker in CALL_MARKERS):
        return True
    body = text.lstrip()
    return body.startswith(("{", "[", "```")) and '"name"' in body and ('"arguments"' in body or '"parameters"' in body)


def guess_name(text: str) -> str:
    match = _NAME.search(text)
    return match.group(1) if match else ""


def call_from_object(obj: Any, *, raw: str, call_id: str | None = None) -> ToolCall:
    """A call from a decoded `{"name": ..., "arguments"|"parameters": ...}` object."""
    if not isinstance(obj, dict):
        return ToolCall(name="", arguments=raw, error="a tool call must be a JSON object with 'name' and 'arguments'")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall(name="", arguments=raw, error="the tool call has no 'name'")
    written_id = obj.get("id")
    if call_id is None and isinstance(written_id, str) and written_id:
        call_id = written_id
    return call_from_arguments(name, obj.get("arguments", obj.get("parameters", {})), call_id=call_id)


def call_from_arguments(name: str, arguments: Any, *, call_id: str | None = None) -> ToolCall:
    """A call from a name and arguments given as a dict or as JSON text."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as error:
            return ToolCall(name=name, arguments=arguments, error=f"'arguments' is not valid JSON ({error.msg})", id=call_id)
    if not isinstance(arguments, dict):
        return ToolCall(name=name, arguments=json.dumps(arguments), error="'arguments' must be a JSON object", id=call_id)
    return ToolCall(name=name, arguments=to_json(arguments), id=call_id)


def parse_json_call(text: str, *, call_id: str | None = None) -> ToolCall:
    """One call from JSON text; a decoding error becomes the call's `error`."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as error:
        return ToolCall(name=guess_name(text), arguments=text, error=f"the tool call is not valid JSON ({error.msg})", id=call_id)
    return call_from_object(obj, raw=text, call_id=call_id)


def arguments_object(call: ToolCall) -> Any:
    """The call's arguments decoded (for writing them back in a family's syntax)."""
    try:
        return json.loads(call.arguments)
    except json.JSONDecodeError:
        return call.arguments


_TEMPLATE_JSON = json.JSONEncoder(ensure_ascii=False)
"""One encoder for every call (`json.dumps` with an option builds a new one each time)."""


def to_json(value: Any) -> str:
    """JSON as chat templates' `tojson` writes it (", " and ": " separators, non-ASCII kept); the text of
    `json.dumps(value, ensure_ascii=False)`."""
    return _TEMPLATE_JSON.encode(value)
