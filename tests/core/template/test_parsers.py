"""Tool-call and reasoning parsers per family: each reads its family's syntax, reports malformed
calls as errors, writes calls back in the same syntax, and a call in another family's syntax is
flagged as unparsed instead of passing silently as an answer."""

import json

import pytest

from gym_bridge.core.errors import UnknownParserError
from gym_bridge.core.turn import ToolCall
from gym_bridge.core.template.parsers import (
    REASONING_PARSERS, TOOL_PARSERS, TurnParser, get_reasoning_parser, get_tool_parser, reasoning_parser_for, tool_parser_candidates,
)


DS = {"begin": "<\uff5ctool\u2581calls\u2581begin\uff5c>", "call": "<\uff5ctool\u2581call\u2581begin\uff5c>",
      "sep": "<\uff5ctool\u2581sep\uff5c>", "call_end": "<\uff5ctool\u2581call\u2581end\uff5c>", "end": "<\uff5ctool\u2581calls\u2581end\uff5c>"}
SAMPLES = {
    "hermes": 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
    "llama3_json": '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}',
    "mistral": 'Let me check.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}, "id": "a1B2c3D4e"}]',
    "deepseek_v3": f'Let me check.{DS["begin"]}{DS["call"]}function{DS["sep"]}get_weather\n```json\n{{"city": "Oslo"}}\n```{DS["call_end"]}{DS["end"]}',
    "deepseek_v31": f'Let me check.{DS["begin"]}{DS["call"]}get_weather{DS["sep"]}{{"city": "Oslo"}}{DS["call_end"]}{DS["end"]}',
    "granite": 'Let me check.<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Oslo"}}]',
    "phi4_mini_json": 'Let me check.functools[{"name": "get_weather", "arguments": {"city": "Oslo"}}]',
    "openai": "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
              '<|constrain|>json<|message|>{"city": "Oslo"}',
    "qwen3_coder": "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>",
}
MALFORMED = {
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>',
    "llama3_json": '{"name": "get_weather", "parameters": {"city": }',
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": ]',
    "deepseek_v3": f'{DS["begin"]}{DS["call"]}function{DS["sep"]}get_weather\n```json\n{{"city": \n```{DS["call_end"]}{DS["end"]}',
    "deepseek_v31": f'{DS["begin"]}{DS["call"]}get_weather{DS["sep"]}{{"city": {DS["call_end"]}{DS["end"]}',
    "granite": '<|tool_call|>[{"name": "get_weather", "arguments": {"city": ',
    "phi4_mini_json": 'functools[{"name": "get_weather", "arguments": }]',
    "openai": '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": ',
    "qwen3_coder": "<tool_call>\n<function=>\n</function>\n</tool_call>",
}


def test_every_tool_parser_has_a_sample():
    assert set(SAMPLES) == set(MALFORMED) == set(TOOL_PARSERS)


@pytest.mark.parametrize("name", list(TOOL_PARSERS))
def test_reads_its_familys_call_and_the_text_around_it(name):
    turn = TurnParser(get_tool_parser(name)).parse(SAMPLES[name])
    assert [(call.name, json.loads(call.arguments), call.error) for call in turn.calls] == [("get_weather", {"city": "Oslo"}, None)]
    assert turn.text == ("" if name == "llama3_json" else "Let me check.") and turn.parse_errors == 0  # Llama: the call is the whole turn
    if name == "mistral":
        assert turn.calls[0].id == "a1B2c3D4e"  # the id the model wrote is kept


@pytest.mark.parametrize("name", list(TOOL_PARSERS))
def test_malformed_call_is_a_counted_error_not_an_answer(name):
    turn = TurnParser(get_tool_parser(name)).parse(MALFORMED[name])
    assert len(turn.calls) == 1 and turn.calls[0].error, turn
    assert turn.parse_errors == 1


@pytest.mark.parametrize("name", list(TOOL_PARSERS))
def test_format_writes_what_parse_reads(name):
    parser = get_tool_parser(name)
    calls = [ToolCall(name="lookup", arguments='{"word": "a", "n": [1, 2]}', id="x1y2z3w4v"),
             ToolCall(name="submit", arguments='{"values": {"k": true}}', id="a9b8c7d6e")]
    if name in ("openai", "llama3_json"):  # one call per turn in these syntaxes
        calls = calls[:1]
    parsed = parser.parse(parser.format(calls), [])
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [(c.name, json.loads(c.arguments)) for c in calls]
    if name == "mistral":
        assert [c.id for c in parsed.calls] == [c.id for c in calls]


@pytest.mark.parametrize("name", list(TOOL_PARSERS))
def test_a_call_in_another_syntax_is_flagged_unparsed(name):
    # llama3_json reads a JSON call object anywhere (as vLLM does), so it gets a call without JSON
    other = "qwen3_coder" if name == "llama3_json" else "granite" if name != "granite" else "hermes"
    turn = TurnParser(get_tool_parser(name)).parse(SAMPLES[other])
    assert turn.calls == () and turn.unparsed_tool_call, turn


def test_plain_answers_are_not_flagged():
    for name in TOOL_PARSERS:
        turn = TurnParser(get_tool_parser(name)).parse("The answer is \\boxed{4}.")
        assert turn.calls == () and not turn.unparsed_tool_call and turn.text == "The answer is \\boxed{4}."


def test_mistral_small_and_v11_shapes():
    parser = get_tool_parser("mistral")
    small = parser.parse('[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Oslo"}[TOOL_CALLS]noop[ARGS]{}')
    assert [(c.name, c.id) for c in small.calls] == [("get_weather", "a1B2c3D4e"), ("noop", None)]
    v11 = parser.parse('[TOOL_CALLS]get_weather{"city": "Oslo"}')
    assert v11.calls[0].name == "get_weather" and json.loads(v11.calls[0].arguments) == {"city": "Oslo"}


def test_harmony_recipient_in_the_role_or_the_channel_and_reasoning():
    parser = TurnParser(get_tool_parser("openai"), get_reasoning_parser("openai_gptoss"))
    role = parser.parse('<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions.get_weather'
                        '<|channel|>commentary json<|message|>{"city": "Oslo"}')
    channel = parser.parse('<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary '
                           'to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}')
    for turn in (role, channel):
        assert turn.reasoning == "Need weather." and turn.calls[0].name == "get_weather" and turn.text == ""
    final = parser.parse("<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is 4.")
    assert (final.reasoning, final.text, final.calls) == ("Easy.", "It is 4.", ())


def test_qwen3_coder_values_follow_the_schema():
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {
        "code": {"type": "string"}, "n": {"type": "integer"}, "xs": {"type": "array"}}}}]
    text = "<tool_call>\n<function=f>\n<parameter=code>\n407\n</parameter>\n<parameter=n>\n3\n</parameter>\n" \
           "<parameter=xs>\n[1, 2]\n</parameter>\n</function>\n</tool_call>"
    call = get_tool_parser("qwen3_coder").parse(text, tools).calls[0]
    assert json.loads(call.arguments) == {"code": "407", "n": 3, "xs": [1, 2]}  # a string stays a string


def test_think_block_opened_by_the_model_or_by_the_prompt():
    think = REASONING_PARSERS["qwen3"]
    assert think.split("<think>\nhmm\n</think>\n\nIt is 4.") == ("hmm", "It is 4.")
    assert think.split("hmm\n</think>\n\nIt is 4.", opened=True) == ("hmm", "It is 4.")
    assert think.split("still thinking", opened=True) == ("still thinking", "")  # never closed: no answer
    assert think.split("It is 4.") == ("", "It is 4.")
    assert think.split("<think>unfinished") == ("unfinished", "")
    assert REASONING_PARSERS["deepseek_r1"].format("hmm", opened=True) == "hmm\n</think>\n\n"


def test_selection_from_the_template_text():
    assert tool_parser_candidates("{{ '[TOOL_CALLS]' }}") == ["mistral"]
    assert tool_parser_candidates("{{ '<\uff5ctool\u2581call\u2581begin\uff5c>' + '```json' }}")[0] == "deepseek_v3"
    assert tool_parser_candidates("{% for m in messages %}{{ m.content }}{% endfor %}") == ["hermes"]  # no tool support
    assert reasoning_parser_for("<think>", generation_prompt="<|im_start|>assistant\n<think>\n") == "deepseek_r1"
    assert reasoning_parser_for("<think>", generation_prompt="<|im_start|>assistant\n") == "qwen3"
    assert reasoning_parser_for("<|channel|>analysis", generation_prompt="<|start|>assistant") == "openai_gptoss"


def test_unknown_parser_names_list_the_known_ones():
    with pytest.raises(UnknownParserError, match="known tool parsers: hermes, llama3_json, mistral"):
        get_tool_parser("hermes2")
    with pytest.raises(UnknownParserError, match="known reasoning parsers: qwen3, deepseek_r1, openai_gptoss, none"):
        get_reasoning_parser("r1")


@pytest.mark.parametrize(("name", "text", "read"), [  # issue 28: no call where vLLM reads none (held against vLLM in test_parsers_vs_vllm)
    ("granite", '<|tool_call|>{"name": "get_weather", "arguments": {"city": "Oslo"}}', 0),
    ("phi4_mini_json", 'functools[{"name": "get_current_time"}]', 0),
    ("phi4_mini_json", 'functools[{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_current_time"}]', 0),
    ("phi4_mini_json", 'functools[{"name": "get_weather", "parameters": {"city": "Oslo"}}]', 1),
])
def test_json_list_families_read_only_what_vllm_reads(name, text, read):
    turn = TurnParser(get_tool_parser(name)).parse(text)
    assert turn.calls and sum(call.error is None for call in turn.calls) == read
    assert turn.parse_errors == len(turn.calls) - read  # the model is told why each unread call was not run
