"""Qwen3-Coder XML tool calls (vLLM's `qwen3_coder`): `<tool_call>`, `<function=NAME>`, one
`<parameter=KEY>` block per argument, `</function>`, `</tool_call>`. Values carry no types: a value
stays text where the offered schema says `string` and is decoded as JSON otherwise.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping, Sequence

from gym_bridge.core.template.parsers.call import arguments_object, to_json
from gym_bridge.core.turn import ToolCall, Turn

_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_FUNCTION = re.compile(r"<function=([^>\n]*)>(.*?)(?:</function>|$)", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]*)>(.*?)(?:</parameter>|(?=<parameter=)|$)", re.DOTALL)


def _property_types(tools: Sequence[Mapping[str, Any]], name: str) -> dict[str, Any]:
    for schema in tools:
        function = schema.get("function", schema)
        if function.get("name") == name:
            return {key: spec.get("type") for key, spec in ((function.get("parameters") or {}).get("properties") or {}).items()
                    if isinstance(spec, Mapping)}
    return {}


def _value(raw: str, declared: Any) -> Any:
    text = raw.removeprefix("\n").removesuffix("\n")
    if declared == "string":
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


class Qwen3CoderParser:
    name = "qwen3_coder"
    markers = ("<function=",)

    def parse(self, text: str, tools: Sequence[Mapping[str, Any]] = ()) -> Turn:
        if "<function=" not in text:
            return Turn(reasoning="", text=text.strip())
        calls = []
        for body in _CALL.findall(text) or [text]:
            for name, params in _FUNCTION.findall(body):
                name = name.strip()
                if not name:
                    calls.append(ToolCall(name="", arguments=params, error="the tool call has no function name"))
                    continue
                types = _property_types(tools, name)
                arguments = {key.strip(): _value(value, types.get(key.strip())) for key, value in _PARAMETER.findall(params)}
                calls.append(ToolCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False)))
        start = text.find("<tool_call>")
        content = text[: start if start >= 0 else text.find("<function=")]
        return Turn(reasoning="", text=content.strip(), calls=tuple(calls))

    def format(self, calls: Sequence[ToolCall]) -> str:
        out = []
        for call in calls:
            arguments = arguments_object(call)
            params = "".join(
                f"<parameter={key}>\n{value if isinstance(value, str) else to_json(value)}\n</parameter>\n"
                for key, value in (arguments.items() if isinstance(arguments, dict) else ())
            )
            out.append(f"<tool_call>\n<function={call.name}>\n{params}</function>\n</tool_call>")
        return "\n".join(out)
