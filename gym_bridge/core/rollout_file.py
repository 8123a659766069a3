"""Rollout JSONL files that survive being killed: append-as-you-go, resume exactly once.

Records are appended and flushed one line at a time, written with orjson (a record holds
thousands of token ids; the standard library's encoder cost as much as the rest of a remote
rollout's client-side work). On resume, a torn last line (the process
was killed mid-write) is dropped, failed rollouts are dropped so they run again, and the file
is rewritten atomically with what is kept; the caller then skips every (task, repeat) kept.
`locked_output` keeps a second run from writing the same file (an exclusive lock on `<file>.lock`).
"""

from __future__ import annotations

import json
import os
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import orjson

from gym_bridge.core import lock_file
from gym_bridge.core.errors import DataError, UserError
from gym_bridge.core.task import RECORD_FIELDS, Task


_ORJSON_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


def dump_line(record: Any) -> str:
    """One record as a JSON line (no newline). JSON has no NaN or infinity: such a number (which no
    reward can be: `VerifyResult` refuses it) is written as null."""
    return orjson.dumps(record, option=_ORJSON_OPTIONS).decode()


def load_line(line: str | bytes) -> Any:
    """One JSON line as a record; raises `json.JSONDecodeError` when it is not JSON."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return json.loads(line)  # files written before orjson may hold NaN or Infinity, which orjson rejects


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The complete records of a rollout file; a torn final line is ignored, a torn middle line is an error,
    and so is a line that is JSON but not an object (DataError naming the line)."""
    path = Path(path)
    lines = path.read_bytes().split(b"\n")
    records: list[dict[str, Any]] = []
    for line_number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = load_line(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            if line_number == len(lines):  # no newline after it: the write was cut off
                break
            raise DataError("malformed JSON (or invalid UTF-8) in a rollout file", source=f"{path}:{line_number}") from None
        if not isinstance(record, dict):
            raise DataError(f"is a JSON {type(record).__name__}, not a record (a rollout file holds one JSON object a line)",
                            source=f"{path}:{line_number}")
        records.append(record)
    return records


def input_row(record: dict[str, Any]) -> dict[str, Any]:
    """The task row a record was made from (the record minus the fields rollouts add)."""
    return {key: value for key, value in record.items() if key not in RECORD_FIELDS}


def same_row(stored: dict[str, Any], row: dict[str, Any]) -> bool:
    """Whether a record's row is `row` as written: compared as the JSON the record holds, so a NaN
    of the row (pandas' missing value; a record stores null) matches, and so does a tuple its list."""
    if stored == row:
        return True
    try:
        return _canonical(stored) == _canonical(row)
    except TypeError:  # orjson.JSONEncodeError: not a row a record could hold
        return False


def _canonical(value: Any) -> bytes:
    return orjson.dumps(value, option=_ORJSON_OPTIONS | orjson.OPT_SORT_KEYS)


def _write_atomic(path: Path, records: Iterable[dict[str, Any]]) -> None:
    temp = path.with_name(path.name + ".tmp")
    with temp.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(dump_line(record) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, path)


def prepare_resume(path: str | Path, tasks: Sequence[Task]) -> set[tuple[int, int]]:
    """Keep the finished, unfailed rollouts of `path`; return their (task_index, repeat_index).

    A rollout written twice keeps its last record, with a warning. Raises DataError when the file
    holds rollouts of other tasks than `tasks`.
    """
    kept = resume_records(path, tasks)
    if Path(path).exists():
        keep_only(path, kept.values())
    return set(kept)


def resume_records(path: str | Path, tasks: Sequence[Task]) -> dict[tuple[int, int], dict[str, Any]]:
    """The records `prepare_resume` keeps (in file order) by (task_index, repeat_index), without writing: a resumed
    run checks its settings against them, then writes them back (`keep_only`) and adds them to its summary instead of
    reading the file back."""
    path = Path(path)
    if not path.exists():
        return {}
    by_index = {task.index: task for task in tasks}
    kept: dict[tuple[int, int], dict[str, Any]] = {}
    duplicates: list[tuple[int, int]] = []
    for number, record in enumerate(read_records(path), start=1):
        key = _rollout_key(record)
        if key is None:
            raise DataError("has no integer task_index and repeat_index: not a rollout of gym-bridge eval; "
                            "choose a new --output", source=f"{path}, record {number}")
        task = by_index.get(key[0])
        if task is None or not same_row(input_row(record), task.row):
            raise DataError(
                f"holds a rollout of task {key[0]} that is not task {key[0]} of this run; "
                "resume with the same --env/--data/--limit arguments, or choose a new --output",
                source=str(path),
            )
        if record.get("failure_kind") is None:
            if key in kept:
                duplicates.append(key)
            kept[key] = record
    if duplicates:
        warnings.warn(f"{path}: {len(duplicates)} rollouts appear more than once (first: task {duplicates[0][0]}, repeat "
                      f"{duplicates[0][1]}); resuming keeps the last record of each", stacklevel=2)
    return kept


def keep_only(path: str | Path, records: Iterable[dict[str, Any]]) -> None:
    """Replace `path` with `records`, atomically: what a resumed run appends to."""
    _write_atomic(Path(path), records)


def _rollout_key(record: dict[str, Any]) -> tuple[int, int] | None:
    """A record's (task_index, repeat_index), or None when they are not both integers."""
    task_index, repeat_index = record.get("task_index"), record.get("repeat_index")
    if type(task_index) is int and type(repeat_index) is int:  # not bool: true/false are no indices
        return task_index, repeat_index
    return None


class OutputLockedError(UserError):
    """Another process is writing the same rollout file."""


_held_locks: dict[str, int | None] = {}
"""Lock files this process holds: path -> file descriptor."""


@contextmanager
def locked_output(path: str | Path) -> Iterator[None]:
    """Hold an exclusive lock on `<path>.lock` while writing `path`; re-entrant within a process.

    Raises OutputLockedError at once, naming the holder, when another process holds it
    (`gym_bridge.core.lock_file`: removed when the block ends, taken over from a killed run).
    """
    lock_path = Path(path).resolve()
    lock_path = lock_path.with_name(lock_path.name + ".lock")
    key = str(lock_path)
    if key in _held_locks:  # taken by an outer call in this process (the CLI, before loading the model)
        yield
        return
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = lock_file.acquire(lock_path, lambda holder: OutputLockedError(
        f"{path} is being written by another gym-bridge run (pid {holder}, lock {lock_path}); "
        "wait for it to finish, or choose another --output"))
    _held_locks[key] = fd
    try:
        yield
    finally:
        del _held_locks[key]
        lock_file.release(fd, lock_path)


class RolloutWriter:
    """Appends records to a JSONL file, one flushed line each."""

    def __init__(self, path: str | Path, *, append: bool) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = self.path.open("ab" if append else "wb")

    def write(self, record: dict[str, Any]) -> None:
        self._handle.write(orjson.dumps(record, option=_ORJSON_OPTIONS | orjson.OPT_APPEND_NEWLINE))
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> "RolloutWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
