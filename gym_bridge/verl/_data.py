"""Task rows as verl data: `gym-bridge data to-verl IN.jsonl ... --output OUT.parquet`, and their checks.

Each parquet row has the columns verl reads, the routing column `agent_ref` and the task row as JSON
(`gym_bridge_row`); rows are checked like `gym-bridge eval` checks them, when written and again when
verl loads them (`check_verl_files`). Needs pyarrow (the `verl` extra), not verl itself.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gym_bridge.core.errors import ConfigError, DataError, MissingExtraError, UnknownEnvironmentError
from gym_bridge.core.output_file import check_not_an_input, replaced_atomically
from gym_bridge.core.registry import resolve_tasks
from gym_bridge.core.task import Task, load_tasks, parse_task, routing_name

AGENT_NAME = "gym_bridge"
"""The `agent_name` of every row, and the `name` of the agent loop in the shipped YAML."""
ROW_COLUMN = "gym_bridge_row"
AGENT_LOOP_CONFIG = Path(__file__).with_name("agent_loop.yaml")
"""The agent-loop YAML for `actor_rollout_ref.rollout.agent.agent_loop_config_path`."""
GROUND_TRUTH_KEYS = ("expected_answer", "ground_truth", "answer", "expected_synonym_values")
VERL_COLUMNS = frozenset({
    "data_source", "prompt", "raw_prompt", "agent_name", "reward_model", "extra_info", "index", "tools_kwargs",
    "interaction_kwargs", "dummy_tensor", "uid", "priority", "__do_sample__", "__rollout_n__", ROW_COLUMN,
    "session_id", "global_steps", "validate", "raw_prompt_ids", "multi_modal_data",
})
"""Columns verl adds or reads itself (V1's worker adds `session_id` and `global_steps` to every sample);
every other column of a row without `gym_bridge_row` is task metadata."""


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise MissingExtraError("verl data needs pyarrow: pip install 'gym-bridge[verl]'") from None
    return pyarrow


def ground_truth(row: Mapping[str, Any]) -> str:
    """The row's reference answer as text for verl's `reward_model.ground_truth` ('' when it has none)."""
    for key in GROUND_TRUTH_KEYS:
        if row.get(key) is not None:
            value = row[key]
            return value if isinstance(value, str) else json.dumps(value)
    return ""


def to_verl_row(task: Task, *, index: int, env_name: str | None = None) -> dict[str, Any]:
    """One parquet row for a task (see the module docstring); `env_name` is the environment's own name
    (`data_source`, by which verl groups metrics) when the row routes by an alias."""
    env_name = env_name or task.env_name
    row = task.row if routing_name(task.row) is not None else {**task.row, "environment": task.env_name}
    ref = row.get("agent_ref")
    ref_type = ref.get("type") if isinstance(ref, Mapping) and isinstance(ref.get("type"), str) else "responses_api_agents"
    return {
        "data_source": env_name,
        "prompt": [{"role": message["role"], "content": str(message.get("content") or "")} for message in task.messages],
        "agent_name": AGENT_NAME,
        "reward_model": {"style": "rule", "ground_truth": ground_truth(row)},
        "extra_info": {"index": index, "split": "train", "env_name": env_name, "source": task.source},
        "agent_ref": {"type": ref_type, "name": task.env_name},
        ROW_COLUMN: json.dumps(row, ensure_ascii=False, default=str),
    }


@dataclass(frozen=True)
class ConversionSummary:
    output: Path
    rows_per_env: dict[str, int]

    def describe(self) -> str:
        counts = ", ".join(f"{env}={count}" for env, count in sorted(self.rows_per_env.items()))
        return (
            f"wrote {sum(self.rows_per_env.values())} rows ({counts}) to {self.output}\n"
            f"train with: data.train_files={self.output} actor_rollout_ref.rollout.agent.agent_loop_config_path={AGENT_LOOP_CONFIG} "
            f"data.custom_cls.path=pkg://gym_bridge.verl data.custom_cls.name=GymBridgeDataset"
        )


def write_verl_parquet(inputs: Sequence[str | Path], output: str | Path, *, default_env: str | None = None,
                       limit: int | None = None) -> ConversionSummary:
    """Convert JSONL task rows to verl's parquet format. Every row of every input is checked (DataError
    with file:line: field, UnknownEnvironmentError) before anything is written."""
    pyarrow = _pyarrow()
    check_not_an_input(output, inputs)
    if Path(output).suffix in (".jsonl", ".json"):
        raise ConfigError(f"--output {output}: to-verl writes parquet; name the file .parquet")
    tasks: list[Task] = []
    for path in inputs:
        if not Path(path).is_file():
            raise DataError("file not found", source=str(path))
        loaded = load_tasks(path, default_env=default_env, limit=limit, start_index=len(tasks))
        if not loaded:
            raise DataError("holds no rows", source=str(path))
        tasks.extend(loaded)
    env_classes = resolve_tasks(tasks)
    rows = [to_verl_row(task, index=position, env_name=env_classes[task.env_name].name) for position, task in enumerate(tasks)]
    output = Path(output)
    with replaced_atomically(output) as temp:
        pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), temp)
    return ConversionSummary(output=output, rows_per_env=dict(Counter(row["data_source"] for row in rows)))


def row_from_columns(columns: Mapping[str, Any]) -> dict[str, Any]:
    """The task row of a verl row: `gym_bridge_row` when present, else built from the columns (the
    chat messages of `prompt`/`raw_prompt`, the routing keys, every other non-verl column)."""
    raw = columns.get(ROW_COLUMN)
    if raw is not None:
        row = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
        if not isinstance(row, Mapping):
            raise DataError(f"must hold a JSON object, got {type(row).__name__}", field=ROW_COLUMN)
        return dict(row)
    messages = columns.get("raw_prompt", columns.get("prompt"))
    row = {key: plain(value) for key, value in columns.items() if key not in VERL_COLUMNS and value is not None}
    if messages is not None:
        row["messages"] = plain(messages)
    return row


def plain(value: Any) -> Any:
    """Numpy arrays and scalars (how verl batches columns) as plain Python values."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


def task_from_columns(columns: Mapping[str, Any], *, index: int, source: str) -> Task:
    """The task of a verl row (raises DataError naming `source` and the field)."""
    try:
        row = row_from_columns(columns)
    except (ValueError, TypeError) as error:
        raise DataError(str(error), source=source, field=ROW_COLUMN) from None
    return parse_task(row, index=index, source=source)


def check_verl_files(paths: Sequence[str | Path]) -> int:
    """Check every row of verl parquet files the way the agent loop will read them; returns the row
    count. Raises DataError (`file:row N: field`) or UnknownEnvironmentError for the first bad row."""
    pyarrow = _pyarrow()
    tasks: list[Task] = []
    for path in paths:
        table = pyarrow.parquet.read_table(path)
        for number, columns in enumerate(table.to_pylist(), start=1):
            tasks.append(task_from_columns(columns, index=len(tasks), source=f"{path}:row {number}"))
    try:
        resolve_tasks(tasks)
    except UnknownEnvironmentError as error:
        raise UnknownEnvironmentError(f"{error}; every row's environment must be installed where verl runs") from None
    return len(tasks)

