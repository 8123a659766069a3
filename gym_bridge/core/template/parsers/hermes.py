"""Hermes / Qwen tool calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one or more.

vLLM's `hermes` parser. Also what the embedded model is taught when its template has no tool
support. An unterminated last call is still read (the turn may have ended on its stop token).
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from gym_bridge.core.template.parsers.call import arguments_object, parse_json_call, to_json
from gym_bridge.core.turn import ToolCall, Turn

_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


class HermesParser:
    name = "hermes"
    markers = ("<tool_call>",)

    def parse(self, text: str, tools: Sequence[Mapping[str, Any]] = ()) -> Turn:
        if "<tool_call>" not in text:
            return Turn(reasoning="", text=text.strip())
        calls = tuple(parse_json_call(body.strip()) for body in _CALL.findall(text))
        return Turn(reasoning="", text=_CALL.sub("", text).strip(), calls=calls)

    def format(self, calls: Sequence[ToolCall]) -> str:
        return "\n".join(
            f'<tool_call>\n{{"name": {to_json(call.name)}, "arguments": {to_json(arguments_object(call))}}}\n</tool_call>' for call in calls
        )
