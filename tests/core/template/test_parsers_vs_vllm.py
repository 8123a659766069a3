"""gym_bridge's tool-call and reasoning parsers held against vLLM's own, as the oracle.

For every parser name gym_bridge supports, the same model outputs go to vLLM's composed parser
(what `vllm serve --tool-call-parser X --reasoning-parser Y` runs, built with a tokenizer that has
the family's special tokens) and to gym_bridge's: generated turns (seeded random calls written by
gym_bridge's `format` and by each family's writer in tests/support/families.py) and real-format turns
(the shapes of vLLM's own parser tests and of issue 20). Both must give the same calls (names and
arguments), content and reasoning, except where gym_bridge differs on purpose: those cases name
one entry of `DIFFERENCES`, whose check asserts the documented difference (and that it is there).

Needs vLLM (skipped otherwise). Run it in a virtualenv that has vLLM and pytest, with this checkout
first on the path:
    PYTHONPATH=$PWD VLLM_VENV/bin/python -m pytest -q -m vllm tests/core/template/test_parsers_vs_vllm.py
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any, Callable

import pytest

from gym_bridge.core.template.parsers import REASONING_PARSERS, TOOL_PARSERS, TurnParser, get_reasoning_parser, get_tool_parser
from gym_bridge.core.turn import ToolCall
from tests.support import families

pytestmark = pytest.mark.vllm
try:
    import vllm  # noqa: F401
except Exception as error:  # not installed, or installed but broken (a torchvision that does not match torch)
    pytest.skip(f"vLLM is not importable here ({error!r}): run this oracle under a virtualenv with vLLM (see the module docstring)",
                allow_module_level=True)

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest  # noqa: E402
from vllm.parser.parser_manager import ParserManager  # noqa: E402

Calls = tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Outcome:
    """One parser's reading of a turn, normalised: text stripped, a missing text as ''."""

    reasoning: str
    content: str
    calls: Calls
    """(name, arguments decoded; the raw text where they are not a JSON object)."""
    errors: tuple[str, ...] = ()
    """Names of the calls gym_bridge marked malformed (always empty for vLLM)."""
    unparsed: bool = False


@dataclass(frozen=True)
class Case:
    id: str
    tool: str
    text: str
    reasoning: str | None = None
    opened: bool = False
    """The generation prompt opened `<think>` (QwQ, DeepSeek-R1): vLLM's deepseek_r1 assumes it."""
    tokenizer: str = ""
    """Key of families.PARSER_MARKERS ('' for the tool parser's own)."""
    tools: tuple[dict[str, Any], ...] = ()
    differs: str = ""
    """Key of DIFFERENCES where gym_bridge differs from vLLM on purpose ('' where they agree)."""


def _arguments(text: str) -> Any:
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return text
    return value if isinstance(value, dict) else text


def _readable(calls: Calls) -> Calls:
    return tuple(call for call in calls if isinstance(call[1], dict))


# ---- The deliberate differences, in one place: why, and what exactly differs -------------------

@dataclass(frozen=True)
class Difference:
    reason: str
    check: Callable[[Outcome, Outcome], None]
    """Asserts the documented relation between gym_bridge's outcome and vLLM's."""


def _text_around_calls(ours: Outcome, vllm: Outcome) -> None:
    assert ours.calls == vllm.calls and ours.reasoning == vllm.reasoning and not ours.errors
    assert vllm.content in ours.content and ours.content != vllm.content


def _error_call(ours: Outcome, vllm: Outcome) -> None:
    assert ours.errors, "gym_bridge should mark the unreadable call"
    assert _readable(tuple(call for call in ours.calls if call[0] not in ours.errors)) == _readable(vllm.calls)


def _plain_text_is_answer(ours: Outcome, vllm: Outcome) -> None:
    assert ours.calls == vllm.calls and ours.reasoning == "" and ours.content and vllm.reasoning == ours.content


def _reads_more(ours: Outcome, vllm: Outcome) -> None:
    assert vllm.calls == () and ours.calls and not ours.errors


def _mistral_call_id(ours: Outcome, vllm: Outcome) -> None:
    assert [args for _, args in ours.calls] == [args for _, args in vllm.calls] and not ours.errors
    assert all(theirs.startswith(name) and theirs != name for (name, _), (theirs, _) in zip(ours.calls, vllm.calls, strict=True))


def _mistral_json_list_on_v11(ours: Outcome, vllm: Outcome) -> None:
    assert ours.calls and not ours.errors and [name for name, _ in vllm.calls] == ["["]


def _builtin_recipient(ours: Outcome, vllm: Outcome) -> None:
    assert ours.calls == vllm.calls == () and vllm.content == "" and ours.content and ours.unparsed


def _marker_kept(ours: Outcome, vllm: Outcome) -> None:
    assert ours.calls == vllm.calls == () and ours.unparsed and vllm.content in ours.content and ours.content != vllm.content


def _string_arguments(ours: Outcome, vllm: Outcome) -> None:
    assert [name for name, _ in ours.calls] == [name for name, _ in vllm.calls] and not ours.errors
    assert all(isinstance(theirs, str) and json.loads(json.loads(theirs)) == args for (_, args), (_, theirs) in zip(ours.calls, vllm.calls))


DIFFERENCES: dict[str, Difference] = {
    "text_around_calls": Difference(
        "gym_bridge keeps the text before and after the calls as the turn's content; vLLM keeps only the text before the first "
        "call (hermes, mistral, granite, deepseek, qwen3_coder) or none at all (llama3_json, phi4_mini_json)", _text_around_calls),
    "error_call": Difference(
        "a call gym_bridge cannot read (bad JSON, no name, nothing after the marker) becomes an error call the model is told "
        "about; vLLM returns the turn as content, or passes the unreadable arguments on as if they were JSON", _error_call),
    "plain_text_is_answer": Difference(
        "qwen3: a turn with no <think> nor </think> is the answer in gym_bridge (the model skipped thinking, as with "
        "enable_thinking=False); vLLM with thinking on takes text before any call as reasoning", _plain_text_is_answer),
    "deepseek_either_shape": Difference(
        "deepseek_v3 and deepseek_v31 each also read the other version's call shape, and a last call cut off before "
        "<｜tool▁call▁end｜>; vLLM reads only its own shape and complete calls", _reads_more),
    "llama_json_in_prose": Difference(
        "llama3_json: JSON that is no call, or a brace, in the prose around calls leaves the calls standing in gym_bridge "
        "(as in vLLM after 0.32); vLLM 0.32 then drops every call of the turn", _reads_more),
    "mistral_json_list_on_v11": Difference(
        "gym_bridge's one mistral parser reads both the JSON list of pre-v11 tokenizers and name[ARGS]{...} of v11+; vLLM "
        "picks by the tokenizer, and with a v11+ one reads a JSON list as a call named '['", _mistral_json_list_on_v11),
    "mistral_call_id": Difference(
        "name[CALL_ID]id[ARGS]{...} (Mistral Small 3.2): gym_bridge keeps name and id apart; vLLM 0.32 glues the id onto "
        "the name", _mistral_call_id),
    "harmony_builtin_tool": Difference(
        "harmony messages to gpt-oss's built-in tools (browser, python, container), which gym_bridge does not run: vLLM drops "
        "one outside the analysis channel; gym_bridge keeps its text as content and flags the turn as an unparsed call",
        _builtin_recipient),
    "phi4_bracket_in_arguments": Difference(
        "phi4_mini_json: calls whose arguments hold a list or a ']' are read; vLLM ends the list of calls at the first ']' and "
        "then finds no call (and no content)", _reads_more),
    "unread_marker_kept": Difference(
        "a call marker followed by no call of the family's syntax (Hermes' <tool_call>{...} under granite) stays in the "
        "content and flags the turn as holding an unparsed call; vLLM drops the marker", _marker_kept),
    "string_arguments": Difference(
        "arguments written as a JSON string holding an object are decoded; vLLM's hermes and llama3_json pass the string on",
        _string_arguments),
}


# ---- Real-format turns -------------------------------------------------------------------------

DS_CALLS, DS_CALL, DS_SEP, DS_CALL_END, DS_CALLS_END = (
    "<\uff5ctool\u2581calls\u2581begin\uff5c>", "<\uff5ctool\u2581call\u2581begin\uff5c>", "<\uff5ctool\u2581sep\uff5c>",
    "<\uff5ctool\u2581call\u2581end\uff5c>", "<\uff5ctool\u2581calls\u2581end\uff5c>")
WEATHER = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
ANALYSIS = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"


def _real(id: str, tool: str, text: str, **kwargs: Any) -> Case:
    return Case(id=f"real-{id}", tool=tool, text=text, **kwargs)


REAL_CASES = [
    # Qwen3 / Hermes
    _real("qwen3-call-after-think", "hermes", f"<think>\nNeed data.\n</think>\n\nLet me check.\n<tool_call>\n{WEATHER}\n</tool_call>", reasoning="qwen3"),
    _real("qwen3-call-before-close", "hermes", f"<think>\nNeed data. <tool_call>\n{WEATHER}\n</tool_call>\n</think>", reasoning="qwen3"),
    _real("qwen3-call-never-closed", "hermes", f"<think>\nNeed data. <tool_call>\n{WEATHER}\n</tool_call>", reasoning="qwen3"),
    _real("qwen3-opened-by-template", "hermes", f"Need data. <tool_call>\n{WEATHER}\n</tool_call></think>", reasoning="qwen3"),
    _real("qwen3-answer", "hermes", "<think>\nEasy.\n</think>\n\nIt is 4.", reasoning="qwen3"),
    _real("qwen3-unfinished-thought", "hermes", "<think>\nStill thinking", reasoning="qwen3"),
    _real("qwen3-no-think-block", "hermes", "It is 4.", reasoning="qwen3", differs="plain_text_is_answer"),
    _real("qwen3-no-think-block-call", "hermes", f"Let me check.\n<tool_call>\n{WEATHER}\n</tool_call>", reasoning="qwen3",
          differs="plain_text_is_answer"),
    _real("qwq-answer", "hermes", "Easy.\n</think>\n\nIt is 4.", reasoning="deepseek_r1", opened=True),
    _real("qwq-call", "hermes", f"Need data.\n</think>\n\n<tool_call>\n{WEATHER}\n</tool_call>", reasoning="deepseek_r1", opened=True),
    _real("qwq-call-in-reasoning", "hermes", f"Need data. <tool_call>\n{WEATHER}\n</tool_call>", reasoning="deepseek_r1", opened=True),
    _real("qwq-never-closed", "hermes", "Still thinking", reasoning="deepseek_r1", opened=True),
    _real("hermes-two-calls", "hermes", f'<tool_call>\n{WEATHER}\n</tool_call>\n<tool_call>\n{{"name": "noop", "arguments": {{}}}}\n</tool_call>'),
    _real("hermes-unterminated", "hermes", f"<tool_call>\n{WEATHER}"),
    _real("hermes-text-between-calls", "hermes", f"Let me check.\n<tool_call>\n{WEATHER}\n</tool_call>\nand\n<tool_call>\n"
          '{"name": "noop", "arguments": {}}\n</tool_call>', differs="text_around_calls"),
    _real("hermes-bad-json", "hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>', differs="error_call"),
    _real("hermes-string-arguments", "hermes", '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}\n</tool_call>',
          differs="string_arguments"),
    _real("hermes-answer", "hermes", "The answer is \\boxed{4}."),
    # Llama 3
    _real("llama-tagged", "llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}'),
    _real("llama-arguments-key", "llama3_json", '{"name": "searchTool", "arguments": {"query": "test"}}'),
    _real("llama-semicolons", "llama3_json", '{"name": "searchTool", "parameters": {"query": "test1"}}; {"name": "getOpenIncidentsTool", '
          '"parameters": {}} ; {"name": "searchTool", "parameters": {"query": "test2"}}'),
    _real("llama-newline", "llama3_json", '{"name": "searchTool", "parameters": {"query": "a"}}\n{"name": "noop", "parameters": {}}'),
    _real("llama-list", "llama3_json", '[{"name": "searchTool", "parameters": {"query": "a"}}, {"name": "noop", "parameters": {}}]'),
    _real("llama-fenced", "llama3_json", '```json\n{"name": "searchTool", "parameters": {"query": "a"}}\n```'),
    _real("llama-nested", "llama3_json", '{"name": "complexTool", "parameters": {"level1": {"level2": {"level3": {"value": "deep"}}}}}'),
    _real("llama-braces-in-strings", "llama3_json", '{"name": "searchTool", "parameters": {"query": "test {value} [complex]", '
          '"nested": {"inner": "more {brackets}"}}}'),
    _real("llama-in-prose", "llama3_json", 'Here is the result: {"name": "getOpenIncidentsTool", "parameters": {}} Would you like to know more?',
          differs="text_around_calls"),
    _real("llama-several-in-prose", "llama3_json", 'Here are the results: {"name": "searchTool", "parameters": {"query": "test1"}}; '
          '{"name": "getOpenIncidentsTool", "parameters": {}} Would you like to know more?', differs="text_around_calls"),
    _real("llama-brace-in-prose", "llama3_json", '{"name": "searchTool", "parameters": {"query": "test"}} I used {searchTool} for this.',
          differs="llama_json_in_prose"),
    _real("llama-json-in-prose", "llama3_json", '{"name": "searchTool", "parameters": {"query": "test"}} The arguments were {"query": "test"}',
          differs="llama_json_in_prose"),
    _real("llama-plain-json", "llama3_json", 'The JSON is {"a": 1}.'),
    _real("llama-no-parameters", "llama3_json", '{"name": "toolWithoutParams"}'),
    _real("llama-missing-name", "llama3_json", '{"parameters": {}}'),
    _real("llama-bad-json", "llama3_json", '{"name": "invalidTool", "parameters": {invalid json}', differs="error_call"),
    _real("llama-answer", "llama3_json", "This is just some text without any tool calls"),
    # Mistral, pre-v11 tokenizers (v0.3, Nemo)
    _real("mistral-v3-list", "mistral", '[TOOL_CALLS][{"name": "add", "arguments": {"a": 3.5, "b": 4}, "id": "a1B2c3D4e"}, '
          '{"name": "noop", "arguments": {}}]', tokenizer="mistral_v3"),
    _real("mistral-v3-content-first", "mistral", f"Let me check.[TOOL_CALLS] [{WEATHER}]", tokenizer="mistral_v3"),
    _real("mistral-v3-object", "mistral", f"[TOOL_CALLS] {WEATHER}", tokenizer="mistral_v3"),
    _real("mistral-v3-trailing-text", "mistral", f"[TOOL_CALLS] [{WEATHER}] Let me know.", tokenizer="mistral_v3", differs="text_around_calls"),
    _real("mistral-v3-leading-junk", "mistral", f"[TOOL_CALLS] Sure: [{WEATHER}]", tokenizer="mistral_v3", differs="text_around_calls"),
    _real("mistral-v3-string-arguments", "mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}]',
          tokenizer="mistral_v3"),
    _real("mistral-v3-bad-json", "mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": ]', tokenizer="mistral_v3",
          differs="error_call"),
    _real("mistral-v3-no-call", "mistral", "[TOOL_CALLS]hello there", tokenizer="mistral_v3", differs="error_call"),
    # Mistral, v11+ tokenizers
    _real("mistral-v11-args", "mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}[TOOL_CALLS]noop[ARGS]{}'),
    _real("mistral-v11-brace", "mistral", 'Let me check.[TOOL_CALLS]get_weather{"city": "Oslo"}'),
    _real("mistral-v11-bare-name", "mistral", "[TOOL_CALLS]get_current_time"),
    _real("mistral-v11-empty-args", "mistral", "[TOOL_CALLS]get_current_time[ARGS]"),
    _real("mistral-v11-trailing-text", "mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"} and then', differs="text_around_calls"),
    _real("mistral-v11-call-id", "mistral", '[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Oslo"}', differs="mistral_call_id"),
    _real("mistral-v11-json-list", "mistral", f"[TOOL_CALLS][{WEATHER}]", differs="mistral_json_list_on_v11"),
    _real("mistral-v11-bad-json", "mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": ', differs="error_call"),
    # DeepSeek
    _real("deepseek-v3", "deepseek_v3", f'Let me check.{DS_CALLS}{DS_CALL}function{DS_SEP}get_weather\n```json\n{{"city": "Oslo"}}\n```'
          f"{DS_CALL_END}{DS_CALLS_END}"),
    _real("deepseek-v3-two", "deepseek_v3", f'{DS_CALLS}{DS_CALL}function{DS_SEP}get_weather\n```json\n{{"city": "Oslo"}}\n```{DS_CALL_END}\n'
          f"{DS_CALL}function{DS_SEP}noop\n```json\n{{}}\n```{DS_CALL_END}{DS_CALLS_END}"),
    _real("deepseek-r1-reasoning", "deepseek_v3", f'Need data.\n</think>\n\n{DS_CALLS}{DS_CALL}function{DS_SEP}get_weather\n```json\n'
          f'{{"city": "Oslo"}}\n```{DS_CALL_END}{DS_CALLS_END}', reasoning="deepseek_r1", opened=True),
    _real("deepseek-v3-reads-v31", "deepseek_v3", f'{DS_CALLS}{DS_CALL}get_weather{DS_SEP}{{"city": "Oslo"}}{DS_CALL_END}{DS_CALLS_END}',
          differs="deepseek_either_shape"),
    _real("deepseek-v3-text-after", "deepseek_v3", f'{DS_CALLS}{DS_CALL}function{DS_SEP}get_weather\n```json\n{{"city": "Oslo"}}\n```'
          f"{DS_CALL_END}{DS_CALLS_END}Done.", differs="text_around_calls"),
    _real("deepseek-v31", "deepseek_v31", f'Let me check.{DS_CALLS}{DS_CALL}get_weather{DS_SEP}{{"city": "Oslo"}}{DS_CALL_END}'
          f"{DS_CALL}noop{DS_SEP}{{}}{DS_CALL_END}{DS_CALLS_END}"),
    _real("deepseek-v31-reads-v3", "deepseek_v31", f'{DS_CALLS}{DS_CALL}function{DS_SEP}get_weather\n```json\n{{"city": "Oslo"}}\n```'
          f"{DS_CALL_END}{DS_CALLS_END}", differs="deepseek_either_shape"),
    _real("deepseek-v31-unterminated", "deepseek_v31", f'{DS_CALLS}{DS_CALL}get_weather{DS_SEP}{{"city": "Oslo"}}',
          differs="deepseek_either_shape"),
    # Granite
    _real("granite-3.0", "granite", f'<|tool_call|>[{WEATHER}, {{"name": "noop", "arguments": {{}}}}]'),
    _real("granite-3.1", "granite", f"<tool_call> [{WEATHER}]"),
    _real("granite-3.1-content-first", "granite", f"Sure. <tool_call>[{WEATHER}]"),
    _real("granite-text-after", "granite", f"Sure <|tool_call|> [{WEATHER}] after", differs="text_around_calls"),
    _real("granite-single-object", "granite", f"<|tool_call|>{WEATHER}", differs="error_call"),  # issue 28: no call, as in vLLM
    _real("granite-hermes-syntax", "granite", f"<tool_call>\n{WEATHER}\n</tool_call>", differs="unread_marker_kept"),
    _real("granite-empty-list", "granite", "<|tool_call|>[]", differs="error_call"),
    _real("granite-bad-json", "granite", '<|tool_call|>[{"name": "get_weather", "arguments": {"city": }]', differs="error_call"),
    # Phi-4-mini
    _real("phi4", "phi4_mini_json", f'functools[{WEATHER}, {{"name": "noop", "arguments": {{}}}}]'),
    _real("phi4-no-arguments", "phi4_mini_json", 'functools[{"name": "get_current_time"}]', differs="error_call"),  # issue 28
    _real("phi4-one-without-arguments", "phi4_mini_json", f'functools[{WEATHER}, {{"name": "get_current_time"}}]', differs="error_call"),
    _real("phi4-parameters-key", "phi4_mini_json", 'functools[{"name": "get_weather", "parameters": {"city": "Oslo"}}]'),
    _real("phi4-list-argument", "phi4_mini_json", 'functools[{"name": "lookup", "arguments": {"values": [1, 2]}}]',
          differs="phi4_bracket_in_arguments"),
    _real("phi4-content-first", "phi4_mini_json", f"Let me check.functools[{WEATHER}]", differs="text_around_calls"),
    # Qwen3-Coder
    _real("qwen3-coder", "qwen3_coder", "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
          "</function>\n</tool_call>"),
    _real("qwen3-coder-bare-function", "qwen3_coder", "<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>"),
    _real("qwen3-coder-think", "qwen3_coder", "<think>\nNeed data.\n</think>\n\n<tool_call>\n<function=noop>\n</function>\n</tool_call>",
          reasoning="qwen3"),
    _real("qwen3-coder-call-in-think", "qwen3_coder", "<think>\nNeed data.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n"
          "</parameter>\n</function>\n</tool_call>", reasoning="qwen3"),
    # gpt-oss (harmony)
    _real("harmony-channel-recipient", "openai", f'{ANALYSIS}<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
          '{"city": "Oslo"}<|call|>', reasoning="openai_gptoss"),
    _real("harmony-role-recipient", "openai", f'{ANALYSIS} to=functions.get_weather<|channel|>commentary json<|message|>{{"city": "Oslo"}}'
          "<|call|>", reasoning="openai_gptoss"),
    _real("harmony-bare-recipient", "openai", f'{ANALYSIS} to=get_weather<|channel|>commentary json<|message|>{{"city": "Oslo"}}<|call|>',
          reasoning="openai_gptoss"),
    _real("harmony-bare-recipient-channel", "openai", '<|channel|>commentary to=get_weather <|constrain|>json<|message|>{"city": "Oslo"}'
          "<|call|>", reasoning="openai_gptoss"),
    _real("harmony-preamble", "openai", "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant<|channel|>commentary "
          'to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}<|call|>', reasoning="openai_gptoss"),
    _real("harmony-final", "openai", f"{ANALYSIS}<|channel|>final<|message|>It is 4.<|return|>", reasoning="openai_gptoss"),
    _real("harmony-unfinished", "openai", "<|channel|>analysis<|message|>Still thinking", reasoning="openai_gptoss"),
    _real("harmony-no-stop-token", "openai", f'{ANALYSIS} to=functions.get_weather<|channel|>commentary json<|message|>{{"city": "Oslo"}}',
          reasoning="openai_gptoss"),
    _real("harmony-python-in-analysis", "openai", f"{ANALYSIS} to=python<|channel|>analysis code<|message|>print(1)<|call|>",
          reasoning="openai_gptoss"),
    _real("harmony-browser", "openai", '<|channel|>commentary to=browser.search <|constrain|>json<|message|>{"query": "x"}<|call|>',
          reasoning="openai_gptoss", differs="harmony_builtin_tool"),
    _real("harmony-bad-json", "openai", f'{ANALYSIS} to=functions.get_weather<|channel|>commentary json<|message|>{{"city": }}<|call|>',
          reasoning="openai_gptoss", differs="error_call"),
]


# ---- Generated turns ---------------------------------------------------------------------------

WORDS = ("Oslo", "Zürich", "東京", 'say "hi"', "a\\b", "{x}", "[1, 2]", "", "two words", "line\nbreak", "ünïcode ✓")
KEYS = {"city": "string", "query": "string", "n": "integer", "ratio": "number", "flag": "boolean", "values": "array", "nested": "object"}
NAMES = ("get_weather", "lookup", "submit_answer", "noop")


def _value(rng: random.Random, kind: str) -> Any:
    if kind == "string":
        return rng.choice(WORDS)
    if kind == "integer":
        return rng.randint(-5, 10**6)
    if kind == "number":
        return rng.choice((0.5, -2.25, 3.14159, 1e-3))
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        return [rng.randint(0, 9) for _ in range(rng.randint(0, 3))]
    return {"inner": rng.choice(WORDS), "k": [rng.random() < 0.5]}


def _random_call(rng: random.Random) -> tuple[str, dict[str, Any]]:
    name = rng.choice(NAMES)
    if name == "noop":
        return name, {}
    return name, {key: _value(rng, KEYS[key]) for key in rng.sample(sorted(KEYS), rng.randint(1, 4))}


TOOLS = tuple({"type": "function", "name": name, "parameters": {"type": "object", "properties": {
    key: {"type": kind} for key, kind in KEYS.items()}}} for name in NAMES)
"""Every generated call's schema (qwen3_coder's values carry no type: both parsers read it from here)."""

def _mistral_v11(name: str, arguments: dict[str, Any], call_id: str) -> str:
    return f"[TOOL_CALLS]{name}[ARGS]{json.dumps(arguments)}"  # Mistral v11+ without a call id


# Families whose writers (most in tests/support/families.py) give one call in real format: writer, tokenizer, difference.
WRITERS: dict[str, list[tuple[Callable[..., str], str, str]]] = {
    "hermes": [(families.hermes, "", "")], "llama3_json": [(families.llama3, "", "")],
    "mistral": [(families.mistral_v3, "mistral_v3", ""), (families.mistral_plain, "mistral_v3", ""),
                (families.mistral_v13, "", "mistral_call_id"), (_mistral_v11, "", "")],
    "deepseek_v3": [(families.deepseek_v3, "", "")], "deepseek_v31": [(families.deepseek_v31, "", "")],
    "granite": [(families.granite, "", "")], "phi4_mini_json": [(families.phi4, "", "")],
    "openai": [(families.harmony, "", ""), (families.harmony_template_style, "", "")],
    "qwen3_coder": [(families.qwen3_coder, "", "")],
}
# How each family writes reasoning before its turn: (reasoning parser, writer, opened by the prompt).
REASONING_WRITERS: dict[str, tuple[str, Callable[[str], str], bool]] = {
    "hermes": ("qwen3", families.think, False), "qwen3_coder": ("qwen3", families.think, False),
    "deepseek_v3": ("deepseek_r1", families.opened_think, True), "openai": ("openai_gptoss", families.analysis, False),
}
ONE_CALL_PER_TURN = ("openai",)
PREFIX = {"openai": "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant"}
"""Text before the calls, where it is not plain text."""


def _generated(tool: str, index: int) -> Case:
    rng = random.Random(f"{tool}-{index}")
    reasoning, opened, differs, tokenizer = None, False, "", ""
    count = 1 if tool in ONE_CALL_PER_TURN else rng.randint(1, 3)
    drawn = [_random_call(rng) for _ in range(count)]
    if index % 2:  # the family's own writers in turn, one call
        writer, tokenizer, differs = WRITERS[tool][index // 2 % len(WRITERS[tool])]
        drawn = drawn[:1]
        body = writer(*drawn[0], "c0xYz90Qa")
    else:  # gym_bridge's format, maybe several calls
        body = get_tool_parser(tool).format([ToolCall(name=name, arguments=json.dumps(arguments)) for name, arguments in drawn])
        tokenizer = "mistral_v3" if tool == "mistral" else ""
    if rng.random() < 0.5:
        prefix = PREFIX.get(tool, "Let me check.\n")
        body = prefix + body
        differs = differs or ("text_around_calls" if tool in ("llama3_json", "phi4_mini_json") else "")
    if tool in REASONING_WRITERS and rng.random() < 0.6:
        reasoning, write, opened = REASONING_WRITERS[tool]
        body = write(f"Thought {index}: the user wants {rng.choice(WORDS)}.") + body
    if tool == "phi4_mini_json" and any("]" in json.dumps(arguments) for _, arguments in drawn):
        differs = "phi4_bracket_in_arguments"
    return Case(id=f"gen-{tool}-{index}", tool=tool, text=body, reasoning=reasoning, opened=opened, tokenizer=tokenizer, tools=TOOLS,
                differs=differs)


GENERATED_CASES = [_generated(tool, index) for tool in TOOL_PARSERS for index in range(10)]
CASES = REAL_CASES + GENERATED_CASES


# ---- Running both parsers ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizers() -> Callable[[str], Any]:
    from gym_bridge.policies.embedded import load_embedded_tokenizer

    base, made = load_embedded_tokenizer(), {}

    def get(key: str) -> Any:
        if key not in made:
            made[key] = families.parser_tokenizer(base, families.PARSER_MARKERS[key])
        return made[key]

    return get


def _chat_tools(tools: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": tool["name"], "parameters": tool["parameters"]}} for tool in tools] or [
        {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}} for name in NAMES]


class _HarmonyTokenizer:
    """What vLLM's harmony parser needs of a tokenizer when it recovers a broken message: o200k decoding."""

    def __init__(self, tokenizer: Any, encoding: Any) -> None:
        self._tokenizer, self._encoding = tokenizer, encoding

    def get_vocab(self) -> dict[str, int]:
        return self._tokenizer.get_vocab()

    def decode(self, ids: list[int], **_: Any) -> str:
        return self._encoding.decode(ids)


def vllm_outcome(case: Case, tokenizer: Any) -> Outcome:
    harmony = case.tool == "openai"
    parser_class = ParserManager.get_parser(tool_parser_name=case.tool, reasoning_parser_name=case.reasoning, enable_auto_tools=True,
                                            is_harmony=harmony)
    request = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], model="oracle", tools=_chat_tools(case.tools))
    if harmony:
        from openai_harmony import HarmonyEncodingName, load_harmony_encoding

        encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
        ids, tokenizer = encoding.encode(case.text, allowed_special="all"), _HarmonyTokenizer(tokenizer, encoding)
    else:
        ids = tokenizer.encode(case.text, add_special_tokens=False)
    reasoning, content, calls = parser_class(tokenizer, request.tools).parse(case.text, request, enable_auto_tools=True,
                                                                             model_output_token_ids=ids)
    return Outcome(reasoning=(reasoning or "").strip() if case.reasoning else "", content=(content or "").strip(),
                   calls=tuple((call.name, _arguments(call.arguments)) for call in calls or ()))


def gym_bridge_outcome(case: Case) -> Outcome:
    parser = TurnParser(get_tool_parser(case.tool), get_reasoning_parser(case.reasoning) if case.reasoning else None)
    turn = parser.parse(case.text, opened=case.opened, tools=case.tools)
    return Outcome(reasoning=turn.reasoning.strip() if case.reasoning else "", content=turn.text.strip(),
                   calls=tuple((call.name, _arguments(call.arguments) if call.error is None else call.arguments) for call in turn.calls),
                   errors=tuple(call.name for call in turn.calls if call.error), unparsed=turn.unparsed_tool_call)


def test_every_parser_name_is_held_against_vllm():
    assert {case.tool for case in CASES} == set(TOOL_PARSERS)
    assert {case.reasoning for case in CASES} - {None} == set(REASONING_PARSERS) - {"none"}
    assert {case.differs for case in CASES} - {""} == set(DIFFERENCES)  # every documented difference is shown by a case


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_same_calls_and_content_as_vllm(case, tokenizers):
    ours = gym_bridge_outcome(case)
    theirs = vllm_outcome(case, tokenizers(case.tokenizer or case.tool))
    if not case.differs:
        assert ours == Outcome(reasoning=theirs.reasoning, content=theirs.content, calls=theirs.calls, unparsed=ours.unparsed), case.text
    else:
        DIFFERENCES[case.differs].check(ours, theirs)
