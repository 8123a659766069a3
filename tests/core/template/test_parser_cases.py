"""Model outputs on which gym_bridge's parsers once disagreed with vLLM's (gym_bridge issue 20,
item 5), written in each family's real format: the calls vLLM finds are found, with the text
around them as content. Runs without vLLM; tests/core/template/test_parsers_vs_vllm.py holds the same
outputs against vLLM's own parsers where vLLM is installed."""

import json

import pytest

from gym_bridge.core.template.parsers import TurnParser, get_reasoning_parser, get_tool_parser
from gym_bridge.core.toolcall import parse_turn

WEATHER = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'


def parse(tool: str, text: str, *, reasoning: str | None = None, opened: bool = False):
    parser = TurnParser(get_tool_parser(tool), get_reasoning_parser(reasoning) if reasoning else None)
    return parser.parse(text, opened=opened)


def calls(turn) -> list[tuple[str, dict]]:
    assert all(call.error is None for call in turn.calls), turn.calls
    return [(call.name, json.loads(call.arguments)) for call in turn.calls]


@pytest.mark.parametrize("text", [
    f"<think>\nThe user wants Oslo's weather. <tool_call>\n{WEATHER}\n</tool_call>",  # no </think> at all
    f"<think>\nThe user wants Oslo's weather. <tool_call>\n{WEATHER}\n</tool_call>\n</think>\n\n",  # </think> after the call
    f"The user wants Oslo's weather. <tool_call>\n{WEATHER}\n</tool_call></think>",  # the block opened by the template
])
def test_qwen3_call_inside_the_think_block_is_a_call(text):
    turn = parse("hermes", text, reasoning="qwen3")
    assert calls(turn) == [("get_weather", {"city": "Oslo"})]
    assert turn.reasoning == "The user wants Oslo's weather." and turn.text == ""  # the stray </think> is dropped


def test_qwen3_coder_call_inside_the_think_block_is_a_call():
    text = "<think>\nNeed data.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>"
    turn = parse("qwen3_coder", text, reasoning="qwen3")
    assert (turn.reasoning, calls(turn)) == ("Need data.", [("get_weather", {"city": "Oslo"})])


def test_deepseek_r1_keeps_a_call_in_unclosed_reasoning_but_flags_it():
    # vLLM's deepseek_r1 ends reasoning only at </think>: the call stays reasoning, and gym_bridge says so
    turn = parse("hermes", f"The user wants Oslo.\n<tool_call>\n{WEATHER}\n</tool_call>", reasoning="deepseek_r1", opened=True)
    assert turn.calls == () and "<tool_call>" in turn.reasoning and turn.unparsed_tool_call


def test_think_block_answer_and_plain_answer_unchanged():
    assert parse("hermes", "<think>\nEasy.\n</think>\n\nIt is 4.", reasoning="qwen3").text == "It is 4."
    plain = parse("hermes", "It is 4.", reasoning="qwen3")
    assert (plain.reasoning, plain.text, plain.unparsed_tool_call) == ("", "It is 4.", False)


def test_llama3_call_inside_prose():
    turn = parse("llama3_json", 'Here is the result: {"name": "getOpenIncidentsTool", "parameters": {}} Would you like to know more?')
    assert calls(turn) == [("getOpenIncidentsTool", {})]
    assert turn.text == "Here is the result: Would you like to know more?"


@pytest.mark.parametrize("separator", ["; ", ";", " ; ", "\n"])
def test_llama3_calls_separated_by_semicolons_or_newlines(separator):
    text = separator.join(['{"name": "searchTool", "parameters": {"query": "test1"}}', '{"name": "getOpenIncidentsTool", "parameters": {}}',
                           '{"name": "searchTool", "parameters": {"query": "test2"}}'])
    turn = parse("llama3_json", f"Here are the results: {text} Would you like to know more?")
    assert calls(turn) == [("searchTool", {"query": "test1"}), ("getOpenIncidentsTool", {}), ("searchTool", {"query": "test2"})]
    assert turn.text == "Here are the results: Would you like to know more?"


def test_llama3_json_that_is_no_call_stays_text():
    assert parse("llama3_json", 'The JSON is {"a": 1}.').calls == ()
    assert parse("llama3_json", '{"name": "toolWithoutParams"}').calls == ()  # vLLM needs parameters (or arguments) too
    with_quote = parse("llama3_json", '{"name": "searchTool", "parameters": {"query": "test {value} [x]"}} I used {searchTool}.')
    assert calls(with_quote) == [("searchTool", {"query": "test {value} [x]"})] and with_quote.text == "I used {searchTool}."


def test_llama3_malformed_call_is_an_error_call():
    turn = parse("llama3_json", 'Calling: {"name": "invalidTool", "parameters": {invalid json}')
    assert [(call.name, bool(call.error)) for call in turn.calls] == [("invalidTool", True)] and turn.text == "Calling:"


def test_default_turn_parser_finds_json_calls_in_prose():
    turn = parse_turn('Sure. {"name": "get_weather", "parameters": {"city": "Oslo"}}')
    assert calls(turn) == [("get_weather", {"city": "Oslo"})] and turn.text == "Sure."


def test_mistral_v3_list_with_trailing_text():
    turn = parse("mistral", '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 3.5, "b": 4}}] Let me know if you need more.')
    assert calls(turn) == [("add", {"a": 3.5, "b": 4})] and turn.text == "Let me know if you need more."


def test_mistral_v3_list_after_leading_junk():
    turn = parse("mistral", '[TOOL_CALLS] Sure: [{"name": "add", "arguments": {"a": 1, "b": 2}}]')
    assert calls(turn) == [("add", {"a": 1, "b": 2})] and turn.text == "Sure:"  # not a call named after the junk


def test_mistral_v3_single_object():
    assert calls(parse("mistral", '[TOOL_CALLS]{"name": "add", "arguments": {"a": 1}}')) == [("add", {"a": 1})]


@pytest.mark.parametrize("text", ["[TOOL_CALLS]get_current_time", "[TOOL_CALLS]get_current_time[ARGS]", "[TOOL_CALLS]get_current_time[ARGS]{}"])
def test_mistral_v11_call_without_arguments(text):
    assert calls(parse("mistral", text)) == [("get_current_time", {})]


def test_mistral_v11_call_with_trailing_text():
    turn = parse("mistral", '[TOOL_CALLS]get_weather{"city": "Oslo"} and then I answer.')
    assert calls(turn) == [("get_weather", {"city": "Oslo"})] and turn.text == "and then I answer."


def test_mistral_text_that_is_no_call_is_an_error_call():
    turn = parse("mistral", "[TOOL_CALLS]hello there, no call here")
    assert [(call.name, bool(call.error)) for call in turn.calls] == [("", True)]


@pytest.mark.parametrize("marker", ["<tool_call>", "<tool_call> ", "<|tool_call|>", "<|tool_call|> "])
def test_granite_3_0_and_3_1_markers(marker):
    turn = parse("granite", f'Sure. {marker}[{WEATHER}, {{"name": "noop", "arguments": {{}}}}]')
    assert calls(turn) == [("get_weather", {"city": "Oslo"}), ("noop", {})] and turn.text == "Sure."


def test_granite_plain_tool_call_marker_needs_a_list():
    turn = parse("granite", f"<tool_call>\n{WEATHER}\n</tool_call>")  # Hermes syntax: not Granite's
    assert turn.calls == () and turn.unparsed_tool_call


@pytest.mark.parametrize("header", ["assistant to=get_weather<|channel|>commentary json", "assistant<|channel|>commentary to=get_weather <|constrain|>json"])
def test_harmony_recipient_without_functions_prefix(header):
    text = f'<|channel|>analysis<|message|>Need weather.<|end|><|start|>{header}<|message|>{{"city": "Oslo"}}'
    turn = parse("openai", text, reasoning="openai_gptoss")
    assert (turn.reasoning, turn.text, calls(turn)) == ("Need weather.", "", [("get_weather", {"city": "Oslo"})])


def test_harmony_builtin_tool_is_no_function_call_but_is_flagged():
    turn = parse("openai", '<|channel|>commentary to=browser.search <|constrain|>json<|message|>{"query": "weather"}', reasoning="openai_gptoss")
    assert turn.calls == () and turn.unparsed_tool_call and turn.text == '{"query": "weather"}'
    python = parse("openai", "<|channel|>analysis<|message|>Compute.<|end|><|start|>assistant to=python<|channel|>analysis code<|message|>1+1",
                   reasoning="openai_gptoss")
    assert python.calls == () and python.reasoning == "Compute.\n1+1" and python.unparsed_tool_call
