"""ATIF v1.7 export and import: what the format carries survives a round trip, and `verify` re-scores imported trajectories."""

from __future__ import annotations

import json

from gym_bridge.cli import main
from gym_bridge.core.rollout_file import read_records
from gym_bridge.view.atif import ATIF_VERSION, from_atif, read_atif, to_atif


def check_atif_rules(trajectory: dict) -> None:
    """The rules Harbor's validator enforces that a producer can get wrong."""
    assert trajectory["schema_version"] == ATIF_VERSION and trajectory["agent"]["name"]
    assert [step["step_id"] for step in trajectory["steps"]] == list(range(1, len(trajectory["steps"]) + 1))
    for step in trajectory["steps"]:
        assert step["source"] in ("system", "user", "agent")
        if step["source"] != "agent":
            assert not {"model_name", "reasoning_content", "tool_calls", "metrics"} & set(step)
        calls = {call["tool_call_id"] for call in step.get("tool_calls", [])}
        for result in (step.get("observation") or {}).get("results", []):
            assert result["source_call_id"] in calls  # an observation answers a call of its own step
        for call in step.get("tool_calls", []):
            assert isinstance(call["arguments"], dict)
        metrics = step.get("metrics") or {}
        if "completion_token_ids" in metrics:
            assert len(metrics["completion_token_ids"]) == len(metrics["logprobs"]) == metrics["completion_tokens"]
    json.dumps(trajectory, allow_nan=False)


def test_multi_turn_trajectory_shape(multi_step_file):
    record = read_records(multi_step_file)[0]
    trajectory = to_atif(record)
    check_atif_rules(trajectory)
    steps = trajectory["steps"]
    # system + user from the task, then one agent step per model call (3 tool calls, then the answer)
    assert [step["source"] for step in steps] == ["system", "user", "agent", "agent", "agent", "agent"]
    first = steps[2]
    assert first["tool_calls"] == [{"tool_call_id": "call_0-0_1", "function_name": "get_synonym_value", "arguments": {"synonym": "Warm"}}]
    assert first["observation"]["results"] == [{"source_call_id": "call_0-0_1", "content": '{"synonym_value": 407}'}]
    assert first["metrics"]["prompt_token_ids"] == record["tokens"]["prompt_ids"] and first["metrics"]["logprobs"][0] == -0.25
    assert steps[-1]["message"] == "The values are 407 and 711." and "tool_calls" not in steps[-1]
    assert trajectory["agent"]["tool_definitions"][0]["function"]["name"] == "get_synonym_value"
    assert trajectory["extra"]["gym_bridge"]["reward"] == 1.0


def test_round_trip_keeps_what_atif_carries(mixed_file):
    for record in read_records(mixed_file):
        back = from_atif(json.loads(json.dumps(to_atif(record))))
        assert back == record  # conversation, call ids, arguments, outputs, per-call ids and log-probs, flat token view, scores


def test_foreign_trajectory_without_gym_bridge_extra():
    trajectory = {
        "schema_version": "ATIF-v1.7", "trajectory_id": "t", "agent": {"name": "other", "model_name": "m"},
        "steps": [
            {"step_id": 1, "source": "user", "message": "Weather in Oslo?"},
            {"step_id": 2, "source": "agent", "message": "", "tool_calls": [{"tool_call_id": "c1", "function_name": "get_weather", "arguments": {"city": "Oslo"}}],
             "observation": {"results": [{"source_call_id": "c1", "content": "cold"}]}},
            {"step_id": 3, "source": "agent", "message": "It is cold."},
        ],
    }
    record = from_atif(trajectory)
    assert record["responses_create_params"]["input"] == [{"role": "user", "content": "Weather in Oslo?"}]
    assert [item["type"] for item in record["response"]["output"]] == ["message", "function_call", "function_call_output", "message"]
    assert record["response"]["output"][1]["arguments"] == '{"city": "Oslo"}' and record["tokens"]["completion_ids"] == []


def test_export_then_verify(capsys, mixed_file, tmp_path):
    folder, lines = tmp_path / "atif", tmp_path / "atif.jsonl"
    assert main(["export", "--format", "atif", str(mixed_file), "--output", str(folder)]) == 0
    assert main(["export", "--format", "atif", str(mixed_file), "--output", str(lines)]) == 0
    assert "wrote 5 ATIF-v1.7 trajectories" in capsys.readouterr().out
    assert sorted(path.name for path in folder.iterdir())[0] == "multi_step-0-0.json"
    assert len(read_atif(folder)) == len(read_atif(lines)) == 5
    rescored = tmp_path / "rescored.jsonl"
    assert main(["verify", "--data", str(lines), "--output", str(rescored)]) == 0
    # the verifiers score the imported trajectories as they scored the originals: multi_step task 0 right, the rest 0
    assert [record["reward"] for record in read_records(rescored)] == [record["reward"] for record in read_records(mixed_file)] == [1.0, 0, 0, 0, 0]


def test_export_bad_input_exits_2(capsys, tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "hi"}\n')
    assert main(["export", "--format", "atif", str(rows), "--output", str(tmp_path / "out.jsonl")]) == 2
    assert "is not a rollout record" in capsys.readouterr().err and not (tmp_path / "out.jsonl").exists()
