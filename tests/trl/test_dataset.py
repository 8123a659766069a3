"""gym_bridge.trl.load_dataset: prompts carry a stable task key, rows are validated at load time,
several files mix by seeded weights."""

import json
from collections import Counter

import pytest

from gym_bridge.core.task import task_key
from gym_bridge.trl._dataset import TaskIndex, key_from_prompt, load_dataset
from gym_bridge.core.errors import DataError, UnknownEnvironmentError

WEATHER = {"responses_create_params": {"input": "Weather in Oslo?"}, "agent_ref": {"type": "responses_api_agents", "name": "weather"}}
MATH = {"prompt": "What is 2 + 2? Answer in \\boxed{}.", "environment": "math", "expected_answer": "4"}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_prompt_carries_a_stable_key_and_a_readable_preview():
    registry = TaskIndex()
    dataset = load_dataset([WEATHER, MATH], registry=registry)
    assert dataset.column_names == ["prompt", "task_key", "env_name", "task_row", "source", "metadata"]
    first = dataset[0]
    assert first["prompt"] == f"[gym_bridge weather {task_key(WEATHER)}] Weather in Oslo?"
    assert key_from_prompt(first["prompt"]) == first["task_key"] == task_key(WEATHER)
    assert json.loads(first["task_row"]) == WEATHER
    assert json.loads(dataset[1]["metadata"]) == {"expected_answer": "4"}
    # the key ignores key order: it hashes the canonical JSON
    assert task_key(dict(reversed(list(WEATHER.items())))) == task_key(WEATHER)
    assert registry.get(task_key(MATH)).row == MATH and len(registry) == 2


def test_key_is_found_inside_chat_messages_too():
    key = task_key(MATH)
    assert key_from_prompt([{"role": "user", "content": f"[gym_bridge math {key}] What is 2 + 2?"}]) == key
    assert key_from_prompt("What is 2 + 2?") is None


def test_rows_without_routing_get_the_default_environment_written_in():
    dataset = load_dataset([{"prompt": "Weather in Rome?"}], default_env="weather", registry=TaskIndex())
    assert json.loads(dataset[0]["task_row"]) == {"prompt": "Weather in Rome?", "environment": "weather"}


def test_bad_rows_fail_at_load_time_with_file_line_and_field(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [WEATHER, {"agent_ref": {"name": "weather"}}])
    with pytest.raises(DataError, match=r"bad\.jsonl:2: responses_create_params\.input: row has no input"):
        load_dataset(path, registry=TaskIndex())
    path = write_jsonl(tmp_path / "nowhere.jsonl", [{**MATH, "environment": "no_such_env"}])
    with pytest.raises(UnknownEnvironmentError, match=r"nowhere\.jsonl:1: environment: unknown environment 'no_such_env'"):
        load_dataset(path, registry=TaskIndex())
    tools = {"responses_create_params": {"input": "hi", "tools": [{"type": "function", "name": "get_time", "parameters": {}}]}}
    path = write_jsonl(tmp_path / "tools.jsonl", [{**tools, "environment": "weather"}])
    with pytest.raises(DataError, match=r"tools\.jsonl:1: responses_create_params\.tools\[0\]: tool 'get_time'"):
        load_dataset(path, registry=TaskIndex())


def test_files_mix_by_seeded_weights(tmp_path):
    weather = write_jsonl(tmp_path / "w.jsonl", [{**WEATHER, "i": i} for i in range(3)])
    math = write_jsonl(tmp_path / "m.jsonl", [{**MATH, "i": i} for i in range(5)])
    dataset = load_dataset([weather, math], weights=[3, 1], num_rows=40, seed=7, registry=TaskIndex())
    # 40 rows at 3:1 -> 30 weather rows (10 passes over 3 rows), 10 math rows (2 passes over 5)
    assert Counter(dataset["env_name"]) == {"weather": 30, "math": 10}
    assert Counter(dataset["source"])[f"{weather}:1"] == 10
    assert Counter(dataset["source"])[f"{math}:5"] == 2
    again = load_dataset([weather, math], weights=[3, 1], num_rows=40, seed=7, registry=TaskIndex())
    other = load_dataset([weather, math], weights=[3, 1], num_rows=40, seed=8, registry=TaskIndex())
    assert again["prompt"] == dataset["prompt"] and other["prompt"] != dataset["prompt"]
    # without weights the sources are concatenated as they are
    plain = load_dataset([weather, math], registry=TaskIndex())
    assert plain["source"] == [f"{weather}:{n}" for n in (1, 2, 3)] + [f"{math}:{n}" for n in (1, 2, 3, 4, 5)]
    with pytest.raises(ValueError, match="got 1 weights for 2 sources"):
        load_dataset([weather, math], weights=[1])


def test_index_reads_a_dataset_back():
    dataset = load_dataset([WEATHER, MATH], registry=TaskIndex())
    index = TaskIndex()
    assert index.add_dataset(dataset) == 2 and index.add_dataset(dataset) == 0
    assert index.get(task_key(MATH)).row == MATH
