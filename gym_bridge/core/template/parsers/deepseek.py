"""DeepSeek tool calls between `<｜tool▁calls▁begin｜>` and `<｜tool▁calls▁end｜>`, each in
`<｜tool▁call▁begin｜>` ... `<｜tool▁call▁end｜>`:
- V3 / R1 (vLLM's `deepseek_v3`): `function<｜tool▁sep｜>name` newline, then the arguments in a ```json fence;
- V3.1 (vLLM's `deepseek_v31`): `name<｜tool▁sep｜>{arguments}`.
Both shapes are read by either name; `format` writes the one of its name.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from gym_bridge.core.template.parsers.call import arguments_object, call_from_arguments, to_json
from gym_bridge.core.turn import ToolCall, Turn

CALLS_BEGIN = "<\uff5ctool\u2581calls\u2581begin\uff5c>"
CALLS_END = "<\uff5ctool\u2581calls\u2581end\uff5c>"
CALL_BEGIN = "<\uff5ctool\u2581call\u2581begin\uff5c>"
CALL_END = "<\uff5ctool\u2581call\u2581end\uff5c>"
SEP = "<\uff5ctool\u2581sep\uff5c>"
_CALL = re.compile(re.escape(CALL_BEGIN) + r"(.*?)(?:" + re.escape(CALL_END) + r"|$)", re.DOTALL)
_FENCED = re.compile(r"^([^\n]*)\n```(?:json)?\n(.*?)(?:\n```)?\s*$", re.DOTALL)


def _call(body: str) -> ToolCall:
    head, found, rest = body.partition(SEP)
    if not found:
        return ToolCall(name="", arguments=body, error="the tool call has no <\uff5ctool\u2581sep\uff5c>")
    fenced = _FENCED.match(rest)
    if fenced:  # V3: the type before the separator, the name and a fenced JSON object after it
        name, arguments = fenced.group(1).strip(), fenced.group(2)
    else:
        name, arguments = head.strip(), rest.strip()
    if not name:
        return ToolCall(name="", arguments=arguments, error="the tool call has no name")
    return call_from_arguments(name, arguments)


class DeepSeekParser:
    markers = (CALLS_BEGIN, CALL_BEGIN)

    def __init__(self, name: str) -> None:
        self.name = name

    def parse(self, text: str, tools: Sequence[Mapping[str, Any]] = ()) -> Turn:
        if CALL_BEGIN not in text:
            return Turn(reasoning="", text=text.replace(CALLS_BEGIN, "").strip())
        start = text.find(CALLS_BEGIN)
        start = text.find(CALL_BEGIN) if start < 0 else start
        calls = tuple(_call(body) for body in _CALL.findall(text))
        after = text[text.rfind(CALLS_END) + len(CALLS_END):] if CALLS_END in text else ""
        return Turn(reasoning="", text=(text[:start] + after).strip(), calls=calls)

    def format(self, calls: Sequence[ToolCall]) -> str:
        if self.name == "deepseek_v3":
            body = "\n".join(
                f"{CALL_BEGIN}function{SEP}{call.name}\n```json\n{to_json(arguments_object(call))}\n```{CALL_END}" for call in calls
            )
        else:
            body = "".join(f"{CALL_BEGIN}{call.name}{SEP}{to_json(arguments_object(call))}{CALL_END}" for call in calls)
        return f"{CALLS_BEGIN}{body}{CALLS_END}"
