import pytest

from gym_bridge.core.errors import DataError
from gym_bridge.core.task import load_tasks, parse_json_line, parse_task


def test_nemo_gym_row_with_developer_message_and_metadata():
    row = {
        "responses_create_params": {
            "input": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}],
        },
        "agent_ref": {"type": "responses_api_agents", "name": "weather"},
        "expected_answer": "42",
    }
    task = parse_task(row, index=3)
    assert task.env_name == "weather" and task.index == 3
    assert task.messages == ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"})
    assert task.tools[0]["name"] == "f"
    assert task.get("expected_answer") == "42" and task.row is row


@pytest.mark.parametrize("key", ["environment", "env_class", "task_source"])
def test_peer_routing_keys(key):
    assert parse_task({"prompt": "Hi", key: "math"}, index=0).env_name == "math"


def test_chat_completions_tool_shape_is_accepted():
    row = {"messages": [{"role": "user", "content": "x"}], "environment": "e",
           "responses_create_params": {"tools": [{"type": "function", "function": {"name": "g", "parameters": {}}}]}}
    assert parse_task(row, index=0).tools[0]["name"] == "g"


def test_errors_name_file_line_and_field(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "ok", "environment": "e"}\n\n{"environment": "e", "responses_create_params": {"input": []}}\n')
    with pytest.raises(DataError) as error:
        load_tasks(path)
    assert str(error.value).startswith(f"{path}:3: responses_create_params.input: row has no input")

    path.write_text('{"prompt": "ok", "environment": "e"}\n{"prompt": "ok",\n')
    with pytest.raises(DataError, match=rf"{path.name}:2: malformed JSON"):
        load_tasks(path)

    path.write_text('{"prompt": "no environment"}\n')
    with pytest.raises(DataError, match=r":1: agent_ref: row names no environment"):
        load_tasks(path)
    assert load_tasks(path, default_env="math")[0].env_name == "math"

    path.write_text('{"prompt": "x", "environment": "e", "responses_create_params": {"input": "x", "tools": [{"type": "web_search"}]}}\n')
    with pytest.raises(DataError, match=r"responses_create_params.tools\[0\]"):
        load_tasks(path)


@pytest.mark.parametrize(("line", "said"), [
    # the closing brace missing: json sees the newline and reported "at column 1" (of the line after)
    ('{"prompt": "x", "environment": "math"\n', "malformed JSON: the line ends before its JSON value does (Expecting ',' "
                                                "delimiter); is a closing quote, brace or bracket missing?"),
    # the opening brace missing: the string "prompt" is a whole JSON value, and more follows it at column 9
    ('"prompt": "x"}\n', "malformed JSON: a JSON value ends before column 9 and more text follows; is a closing brace "
                         "too many, or an opening one missing?"),
    ('{"prompt": "x, "environment": "math"}', "malformed JSON (Expecting ',' delimiter at column 17)"),
    # a string never closed on the file's last line: json's message ends in "at" (it said "starting at at column 32")
    ('{"prompt": "x", "environment": "mat', "malformed JSON (Unterminated string starting at column 32)"),
])
def test_malformed_json_lines_are_said_for_a_person(line, said):
    with pytest.raises(DataError) as error:
        parse_json_line(line, source="rows.jsonl:4")
    assert str(error.value) == f"rows.jsonl:4: {said}"


def test_one_task_key_for_trl_datasets_and_the_report():
    """Issue 37 item 5: TRL's dataset and `gym-bridge view` had a `task_key` each, with different digests (SHA-256
    of compact JSON; SHA-1 of spaced JSON). Now both use `core.task.task_key`, whose digest is TRL's, so the keys in
    datasets saved before stay the keys of their rows."""
    from gym_bridge.core.task import task_key
    from gym_bridge.trl._dataset import load_dataset
    from gym_bridge.view.report import compared_task

    row = {"prompt": "Weather in Oslo?", "environment": "weather", "expected_answer": "é 1.5"}
    assert task_key(row) == "8d5630270080ace7"  # sha256 of {"environment":"weather","expected_answer":"é 1.5","prompt":...}
    assert task_key(dict(reversed(list(row.items())))) == task_key(row)  # key order does not matter
    assert load_dataset([row])["task_key"] == [task_key(row)]
    record = {**row, "env": "weather", "step": 3, "reward": 1.0, "response": {"output": []}, "task_index": 0}
    assert compared_task(record) == f"weather:{task_key(row)}"  # the record's fields and a trainer's step left out
