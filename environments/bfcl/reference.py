"""BFCL's reference answers (a row's `ground_truth`) as the tool calls a model would make: what the conformance tests
replay through the engine.

Single-turn ground truth lists, per call, each parameter's acceptable values ("" marks one that may be left out): an
optional parameter that may be left out is, else the first value that is not "" is taken. Multi-turn ground truth is BFCL's call strings per turn, read with Python's `ast`
(literals only, never evaluated); positional arguments take the names of the tool's parameters in order.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

_DECLARED = re.compile(r"This is (Java|JavaScript) (\w+) type parameter")
_ELEMENTS = re.compile(r"The list elements are of type (\w+)")


def chosen(options: Any) -> tuple[bool, Any]:
    """(given, value) from one parameter's acceptable values: the first one that is not "" (BFCL's mark for "may be
    left out"); (False, None) when leaving it out is all there is. A value that is no list is its own only option."""
    if not isinstance(options, list):
        return True, first_choice(options)
    for option in options:
        if option != "":
            return True, first_choice(option)
    return False, None


def first_choice(options: Any) -> Any:
    """A value BFCL accepts, from a possible-answer value: dicts hold per-key option lists, lists hold values."""
    if isinstance(options, dict):
        picked = {key: chosen(values) for key, values in options.items()}
        return {key: value for key, (given, value) in picked.items() if given}
    if isinstance(options, list):
        return [first_choice(value) for value in options]
    return options


def java_text(value: Any, declared: str, element: str = "") -> str:
    """`value` as Java source of type `declared`, the form BFCL's Java type converter reads back."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if declared == "long":
        return f"{value}L"
    if declared == "float":
        return f"{value}f"
    if declared in ("Array", "ArrayList") and isinstance(value, list):
        items = ", ".join(java_element(item, element, quoted=declared == "ArrayList") for item in value)
        return f"new {element or 'Object'}[]{{{items}}}" if declared == "Array" else f"new ArrayList<>(Arrays.asList({items}))"
    if declared == "HashMap" and isinstance(value, dict):
        puts = " ".join(f'put("{key}", {java_literal(item)});' for key, item in value.items())
        return f"new HashMap<String, Object>() {{{{ {puts} }}}}"
    return str(value)


def java_element(value: Any, element: str, *, quoted: bool) -> str:
    """One element of a Java collection of `element`s (String and char elements `quoted` where BFCL's converter
    strips quotes: in an ArrayList, not in an array)."""
    if element == "String":
        return f'"{value}"' if quoted else str(value)
    if element == "char":
        return f"'{value}'" if quoted else str(value)
    return java_text(value, element) if element else java_literal(value)


def java_literal(value: Any) -> str:
    """A value as BFCL's untyped Java value parser reads it (strings quoted)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else str(value)


def javascript_text(value: Any, declared: str) -> str:
    """`value` as JavaScript source of type `declared`, the form BFCL's JavaScript type converter reads back."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if declared == "Bigint":
        return f"{value}n"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def source_text(value: Any, description: str) -> Any:
    """A Java or JavaScript parameter's value as the source text the row's tool asks for (its description names the
    type); other values as they are."""
    declared = _DECLARED.search(description)
    if declared is None:
        return str(value) if "in string representation" in description else value
    language, kind = declared.groups()
    if language == "Java":
        element = _ELEMENTS.search(description)
        return java_text(value, kind, element.group(1) if element else "")
    return javascript_text(value, kind)


def single_turn_calls(ground_truth: list[dict[str, Any]], tools: list[dict[str, Any]], *, source: bool = False) -> list[dict[str, str]]:
    """`[{name, arguments}]` for a single-turn ground truth: dots in names become underscores, as in the row's `tools`;
    a parameter that may be left out is, unless the tool requires it; with `source` (Java, JavaScript) values become
    the source text the tools ask for."""
    described = {tool["name"]: tool["parameters"] for tool in tools or []}
    calls = []
    for call in ground_truth:
        [(name, parameters)] = call.items()
        name = name.replace(".", "_")
        schema = described.get(name, {})
        properties, required = schema.get("properties", {}), set(schema.get("required", []))
        picked = {key: (False, None) if "" in values and key not in required else chosen(values) for key, values in parameters.items()}
        arguments = {key: value for key, (given, value) in picked.items() if given}
        if source:
            arguments = {key: source_text(value, str(properties[key].get("description", ""))) if key in properties else value
                         for key, value in arguments.items()}
        calls.append({"name": name, "arguments": json.dumps(arguments)})
    return calls


def parse_call(text: str, parameter_names: dict[str, list[str]]) -> dict[str, str]:
    """One BFCL call string (`mv(source='a', destination='b')`) as `{name, arguments}`; ValueError when it is not a
    call of a known tool with literal arguments."""
    node = ast.parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.func.id not in parameter_names:
        raise ValueError(f"not a call of a known tool: {text!r}")
    names = parameter_names[node.func.id]
    arguments = {names[position]: ast.literal_eval(value) for position, value in enumerate(node.args)}
    arguments.update({keyword.arg: ast.literal_eval(keyword.value) for keyword in node.keywords if keyword.arg})
    return {"name": node.func.id, "arguments": json.dumps(arguments)}


def multi_turn_calls(ground_truth: list[list[str]], tools: list[dict[str, Any]]) -> list[list[dict[str, str]]]:
    """Per turn, the ground truth's calls as `{name, arguments}` (`tools`: every tool of the entry, held-out ones too)."""
    parameter_names = {tool["name"]: list(tool["parameters"].get("properties", {})) for tool in tools}
    return [[parse_call(text, parameter_names) for text in turn] for turn in ground_truth]


def tool_call_text(calls: list[dict[str, str]]) -> str:
    """The calls in the embedded model's tool-call format (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`)."""
    return "".join(f'<tool_call>{{"name": {json.dumps(call["name"])}, "arguments": {call["arguments"]}}}</tool_call>' for call in calls)
