"""Task rows as a TRL dataset whose `prompt` column carries each task's identity.

TRL hands a rollout function nothing but the `prompt` column, so every prompt starts with a
compact, stable key (`gym_bridge.core.task.task_key`: a hash of the row's canonical JSON) before a readable preview:
`[gym_bridge weather 3f9a1c2b7d4e5f60] What is the weather in Seattle?`. The full row rides in
the `task_row` column and in an in-process registry that `load_dataset` fills, so the rollout
function finds the row from the key alone, on every rank. Rows are checked with gym_bridge's own
parsing and routing when they are loaded: a bad row fails there, naming file:line and field.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from gym_bridge.core.errors import DataError
from gym_bridge.core.mixing import check_weights, weighted_mix
from gym_bridge.core.registry import resolve_tasks
from gym_bridge.core.task import ROUTING_KEYS, Task, canonical_json, iter_jsonl, parse_task, routing_name, task_key

if TYPE_CHECKING:
    import datasets

_PROMPT_TAG = re.compile(r"\[gym_bridge (?P<env>\S+) (?P<key>[0-9a-f]{16})\]")
_INPUT_FIELDS = ("responses_create_params", "messages", "prompt", *ROUTING_KEYS)
PREVIEW_CHARS = 200
COLUMNS = ("prompt", "task_key", "env_name", "task_row", "source", "metadata")
"""Columns of a dataset built by `load_dataset`; all hold strings."""


def to_prompt(task: Task, key: str) -> str:
    """The `prompt` value of a task: its key tag, then the last user message, shortened."""
    users = [message["content"] for message in task.messages if message["role"] == "user"]
    preview = " ".join(str(users[-1] if users else task.messages[-1]["content"]).split())
    if len(preview) > PREVIEW_CHARS:
        preview = preview[: PREVIEW_CHARS - 3] + "..."
    return f"[gym_bridge {task.env_name} {key}] {preview}"


def key_from_prompt(prompt: Any) -> str | None:
    """The task key carried by a prompt (a string, or chat messages holding the tag), or None."""
    if isinstance(prompt, str):
        match = _PROMPT_TAG.search(prompt)
        return match["key"] if match else None
    if isinstance(prompt, list):
        for message in prompt:
            content = message.get("content") if isinstance(message, dict) else None
            key = key_from_prompt(content) if isinstance(content, str) else None
            if key is not None:
                return key
    return None


@dataclass(frozen=True)
class IndexedRow:
    """A registered task row."""

    row: dict[str, Any]
    source: str
    """`file:line` (or `rows[i]`) it came from."""
    position: int
    """Order of registration in this process; the task index rollouts report."""
    task: Task | None = None
    """The row parsed (`load_dataset` in this process parsed it): a batch does not parse it again."""


class TaskIndex:
    """Task rows by key. Loading the same data in the same order gives the same positions on every rank."""

    def __init__(self) -> None:
        self._rows: dict[str, IndexedRow] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, key: object) -> bool:
        return key in self._rows

    def add(self, key: str, row: dict[str, Any], source: str, task: Task | None = None) -> IndexedRow:
        entry = self._rows.get(key)
        if entry is None:
            position = len(self._rows)
            task = None if task is None else replace(task, index=position, source=source)
            entry = self._rows[key] = IndexedRow(row=row, source=source, position=position, task=task)
        return entry

    def get(self, key: str) -> IndexedRow | None:
        return self._rows.get(key)

    def add_dataset(self, dataset: Any) -> int:
        """Register the rows of a dataset built by `load_dataset` (a `datasets.Dataset`, or any
        mapping of column names to lists); returns how many rows were new. Datasets without
        `task_key`/`task_row` columns are skipped."""
        names = getattr(dataset, "column_names", None) or []
        if "task_key" not in names or "task_row" not in names:
            return 0
        keys, rows = list(dataset["task_key"]), list(dataset["task_row"])
        sources = list(dataset["source"]) if "source" in names else [""] * len(keys)
        new = 0
        for key, row_json, source in zip(keys, rows, sources):
            if key not in self._rows:
                self.add(key, json.loads(row_json), source)
                new += 1
        return new


REGISTRY = TaskIndex()
"""Rows registered by `load_dataset` in this process."""


def _read_source(source: Any, position: int) -> tuple[str, list[tuple[str, Any]]]:
    """(name, [(origin, row)]) for one source: a JSONL path or a list of rows."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise DataError("file not found", source=str(path))
        return str(path), [(f"{path}:{line}", row) for line, row in iter_jsonl(path)]
    if isinstance(source, Sequence) and not isinstance(source, (str, bytes)):
        return f"rows#{position}", [(f"rows#{position}[{i}]", row) for i, row in enumerate(source)]
    raise TypeError(f"a source must be a JSONL path or a list of rows, got {type(source).__name__}")


def _split_sources(path_or_rows: Any) -> list[Any]:
    if isinstance(path_or_rows, (str, Path)):
        return [path_or_rows]
    if isinstance(path_or_rows, Sequence) and path_or_rows and all(isinstance(entry, Mapping) for entry in path_or_rows):
        return [list(path_or_rows)]  # one list of rows
    if isinstance(path_or_rows, Sequence) and path_or_rows:
        return list(path_or_rows)
    raise DataError("nothing to load: give a JSONL path, a list of paths, or a list of rows")


def load_dataset(
    path_or_rows: str | Path | Sequence[str | Path] | Sequence[Mapping[str, Any]] | Sequence[Sequence[Mapping[str, Any]]],
    *,
    weights: Sequence[float] | None = None,
    seed: int = 0,
    num_rows: int | None = None,
    limit: int | None = None,
    default_env: str | None = None,
    registry: TaskIndex | None = None,
) -> datasets.Dataset:
    """Build the dataset `gym_bridge.trl.rollout` trains on from NeMo Gym-format task rows.

    `path_or_rows` is one JSONL file, a list of files, a list of rows (dicts), or a list of
    such sources. Without `weights` the sources are concatenated as they are; with one weight
    per source, `num_rows` rows (default: all rows of all sources) are drawn in those
    proportions, each source in seeded shuffled passes, and the mix is shuffled with `seed`.
    `limit` keeps the first rows of each source; `default_env` routes rows that name no
    environment (and is written into them as `environment`).

    Columns (all strings): `prompt` (key tag plus a preview, see `to_prompt`), `task_key`,
    `env_name`, `task_row` (the row as JSON), `source` (`file:line`), `metadata` (JSON of the
    row's fields other than input and routing, e.g. `expected_answer`). Every row is also
    registered in `registry` (the process-wide `REGISTRY` by default).

    Raises DataError (file:line: field) for a malformed row, UnknownEnvironmentError for a row
    that routes nowhere, before anything is returned.
    """
    import datasets

    sources = _split_sources(path_or_rows)
    if weights is not None:
        check_weights(weights, len(sources))
    parsed: list[list[tuple[Task, str]]] = []
    for position, source in enumerate(sources):
        _, rows = _read_source(source, position)
        tasks = []
        for origin, row in rows[:limit] if limit is not None else rows:
            task = parse_task(row, index=0, source=origin, default_env=default_env)
            if routing_name(task.row) is None:  # the default environment written into the row (parsed once)
                task = replace(task, row={**task.row, "environment": task.env_name})
            tasks.append((task, origin))
        if not tasks:
            raise DataError("holds no rows", source=str(source) if isinstance(source, (str, Path)) else f"rows#{position}")
        parsed.append(tasks)
    resolve_tasks(task for tasks in parsed for task, _ in tasks)

    rng = random.Random(seed)
    if weights is None:
        chosen = [entry for tasks in parsed for entry in tasks]
    else:
        total = num_rows if num_rows is not None else sum(len(tasks) for tasks in parsed)
        chosen = weighted_mix(parsed, list(weights), total, rng)

    registry = REGISTRY if registry is None else registry
    columns: dict[str, list[str]] = {name: [] for name in COLUMNS}
    for task, origin in chosen:
        key = task_key(task.row)
        registry.add(key, task.row, origin, task)
        columns["prompt"].append(to_prompt(task, key))
        columns["task_key"].append(key)
        columns["env_name"].append(task.env_name)
        columns["task_row"].append(canonical_json(task.row))
        columns["source"].append(origin)
        columns["metadata"].append(canonical_json({k: v for k, v in task.row.items() if k not in _INPUT_FIELDS}))
    return datasets.Dataset.from_dict(columns)


def example_data_paths(env_names: Iterable[str]) -> list[Path]:
    """The example data files of the named environments (for demos and tests)."""
    from gym_bridge.core.registry import get_environment

    paths = []
    for name in env_names:
        env_class = get_environment(name)
        if env_class.example_data is None:
            raise DataError(f"environment {name!r} ships no example data")
        paths.append(Path(env_class.example_data))
    return paths
