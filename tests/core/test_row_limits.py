"""Rows whose records could not be written, or not resumed (issue 19, items 4 and 5).

An integer beyond 64 bits or a row nested past orjson's 254 levels used to pass every check, run
its rollouts, then crash the record write; they are refused at load, naming file:line and field.
A NaN (pandas' missing value) is written as null, and `--resume` recognises the row.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.errors import DataError
from gym_bridge.core.policy import ScriptedPolicy
from gym_bridge.core.rollout_file import dump_line, prepare_resume, read_records
from gym_bridge.core.task import MAX_ROW_DEPTH, load_tasks, parse_task
from gym_bridge.eval.run import run_eval, select_tasks

ROW = {"prompt": "x", "environment": "tests.support.failing_env:AlwaysRight"}


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("extra", "field", "message"),
    [
        ({"id": 2**64}, "id", "an integer beyond 64 bits"),
        ({"meta": {"hashes": [1, -(2**63) - 1]}}, "meta.hashes[1]", "an integer beyond 64 bits"),
        ({"meta": {"deep": nested(300)}}, "meta.deep" + "[0]" * (MAX_ROW_DEPTH - 2), f"nested more than {MAX_ROW_DEPTH} levels"),
    ],
)
def test_rows_a_record_could_not_hold_are_refused_naming_the_field(extra: dict, field: str, message: str) -> None:
    with pytest.raises(DataError) as error:
        parse_task({**ROW, **extra}, index=0, source="rows.jsonl:7")
    assert str(error.value).startswith(f"rows.jsonl:7: {field}: {message}")


def test_rows_nested_past_the_json_readers_limit_are_a_file_line_error(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(ROW) + "\n" + '{"prompt": "x", "deep": ' + "[" * 5000 + "]" * 5000 + "}\n")
    with pytest.raises(DataError, match=r"rows.jsonl:2: nested too deeply to read"):
        load_tasks(path)


def test_the_limits_themselves_are_accepted_and_written() -> None:
    """2**64 - 1 and -2**63 are what orjson writes; MAX_ROW_DEPTH - 1 levels nest within its 254."""
    row = {**ROW, "big": 2**64 - 1, "small": -(2**63), "deep": nested(MAX_ROW_DEPTH - 1)}
    parse_task(row, index=0)
    assert json.loads(dump_line(row)) == row


def test_a_row_with_nan_is_written_as_null_and_resumes(tmp_path: Path, smol_template, turn) -> None:
    """Item 5: pandas writes NaN for a missing value; the record stores null, and `--resume` used to
    compare null with NaN and refuse the file."""
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({**ROW, "score": value, "id": i}) + "\n" for i, value in enumerate([float("nan"), 1.5])))
    tasks = select_tasks(data_paths=[data])
    engine = Engine(ScriptedPolicy({"": [turn("4")]}), smol_template, EngineConfig())
    output = tmp_path / "out.jsonl"
    asyncio.run(run_eval(engine, tasks, output=output))
    assert [record["score"] for record in read_records(output)] in ([None, 1.5], [1.5, None])
    assert prepare_resume(output, tasks) == {(0, 0), (1, 0)}
    resumed = asyncio.run(run_eval(engine, tasks, output=output, resume=True))
    assert resumed.summary["rollouts"] == 2 and len(read_records(output)) == 2
