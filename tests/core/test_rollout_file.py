"""Rollout files that hold something other than gym-bridge eval's records (found by the type check).

`read_records` returned whatever JSON a line held, and `prepare_resume` keyed records by whatever
`task_index`/`repeat_index` they had: a line that is not an object crashed `--resume` and
`gym-bridge verify` with AttributeError/TypeError, and a record without integer indices was kept
under a key no rollout has, so its task ran again and the file ended with it twice.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gym_bridge.cli import main
from gym_bridge.core.errors import DataError
from gym_bridge.core.rollout_file import prepare_resume, read_records
from gym_bridge.core.task import parse_task

ROW = {"prompt": "x", "environment": "tests.support.failing_env:AlwaysRight"}


@pytest.mark.parametrize(("line", "kind"), [("[1, 2]", "list"), ("5", "int"), ('"response"', "str"), ("null", "NoneType")])
def test_a_line_that_is_not_an_object_is_a_data_error_naming_the_line(tmp_path: Path, line: str, kind: str) -> None:
    path = tmp_path / "out.jsonl"
    path.write_text(json.dumps({**ROW, "task_index": 0, "repeat_index": 0}) + "\n" + line + "\n")
    with pytest.raises(DataError, match=rf"out.jsonl:2: is a JSON {kind}, not a record"):
        read_records(path)
    with pytest.raises(DataError, match=r"out.jsonl:2: is a JSON"):
        prepare_resume(path, [parse_task(ROW, index=0)])


@pytest.mark.parametrize("indices", [{"task_index": 0}, {"task_index": 0, "repeat_index": "0"}, {"task_index": 0, "repeat_index": True}])
def test_resume_refuses_a_record_without_integer_indices(tmp_path: Path, indices: dict) -> None:
    path = tmp_path / "out.jsonl"
    path.write_text(json.dumps({**ROW, **indices, "response": {"output": []}}) + "\n")
    with pytest.raises(DataError, match=r"out.jsonl, record 1: has no integer task_index and repeat_index"):
        prepare_resume(path, [parse_task(ROW, index=0)])
    assert json.loads(path.read_text()) == {**ROW, **indices, "response": {"output": []}}  # left as it was


def test_verify_of_a_file_with_a_non_object_line_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "rollouts.jsonl"
    data.write_text("5\n")
    assert main(["verify", "--data", str(data), "--output", str(tmp_path / "rescored.jsonl")]) == 2
    assert "rollouts.jsonl:1: is a JSON int, not a record" in capsys.readouterr().err
    assert not (tmp_path / "rescored.jsonl").exists()


def test_resume_of_a_rollout_written_twice_keeps_the_last_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    first = {**ROW, "task_index": 0, "repeat_index": 0, "reward": 0.0, "failure_kind": None}
    path.write_text("".join(json.dumps(row) + "\n" for row in (first, {**first, "reward": 1.0})))
    with pytest.warns(UserWarning, match=r"1 rollouts appear more than once \(first: task 0, repeat 0\)"):
        assert prepare_resume(path, [parse_task(ROW, index=0)]) == {(0, 0)}
    assert [record["reward"] for record in read_records(path)] == [1.0]
