import json

from gym_bridge.core.toolcall import parse_turn


def test_hermes_calls_and_surrounding_text():
    turn = parse_turn('Checking.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n<tool_call>{"name": "g", "arguments": {}}</tool_call>')
    assert [(c.name, json.loads(c.arguments), c.error) for c in turn.calls] == [("f", {"x": 1}, None), ("g", {}, None)]
    assert turn.text == "Checking."


def test_unterminated_hermes_call_is_still_read():
    turn = parse_turn('<tool_call>{"name": "f", "arguments": {"x": 2}}')
    assert turn.calls[0].name == "f" and turn.calls[0].error is None


def test_llama3_json_with_python_tag_and_parameters_key():
    turn = parse_turn('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}')
    assert turn.calls[0].name == "get_weather"
    assert json.loads(turn.calls[0].arguments) == {"city": "Oslo"}


def test_plain_json_list_in_a_fence():
    turn = parse_turn('```json\n[{"name": "a", "arguments": {"k": "v"}}, {"name": "b", "arguments": "{\\"n\\": 3}"}]\n```')
    assert [c.name for c in turn.calls] == ["a", "b"]
    assert json.loads(turn.calls[1].arguments) == {"n": 3}


def test_malformed_call_keeps_an_error_for_the_model():
    turn = parse_turn('<tool_call>{"name": "f", "arguments": {"x": }</tool_call>')
    assert len(turn.calls) == 1
    assert turn.calls[0].name == "f"  # guessed from the text so the error can name it
    assert "not valid JSON" in turn.calls[0].error


def test_arguments_that_are_not_an_object_are_an_error():
    turn = parse_turn('<tool_call>{"name": "f", "arguments": [1, 2]}</tool_call>')
    assert turn.calls[0].error == "'arguments' must be a JSON object"


def test_plain_answer_and_json_that_is_not_a_call():
    assert parse_turn("The answer is \\boxed{4}.").calls == ()
    turn = parse_turn('{"answer": 4}')
    assert turn.calls == () and turn.text == '{"answer": 4}'


def test_reasoning_is_split_off():
    turn = parse_turn("<think>2+2 is 4</think>The answer is 4.")
    assert turn.reasoning == "2+2 is 4" and turn.text == "The answer is 4." and turn.calls == ()
