"""Task rows: NeMo Gym-compatible JSONL rows parsed into `Task`s with clear errors.

A row holds `responses_create_params` (`input`, `tools`, sampling fields) or plain chat
`messages`/`prompt`, a routing key (`agent_ref.name`, `environment`, `env_class`,
`task_source`), and any verifier metadata, which flows through untouched in `Task.row`.
A row's identity across runs and processes is its `task_key`, a digest of its canonical JSON.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from gym_bridge.core.errors import DataError
from gym_bridge.core.dialects.chat import ApiError
from gym_bridge.core.dialects.responses import to_messages
from gym_bridge.core.conversation import Message

ROUTING_KEYS = ("agent_ref", "environment", "env_class", "task_source")
RECORD_FIELDS = (
    "response", "reward", "reward_components", "mask_sample", "failure_kind", "failure_reason",
    "env", "env_path", "task_index", "repeat_index", "tokens", "metrics",
)
"""Keys a rollout record adds to its row (`RolloutRecord.to_dict`): a task row may not use them,
so stripping them from a record recovers the row exactly."""
MAX_ROW_DEPTH = 200
"""Deepest nesting of objects and arrays a row may have: its record is written with orjson, which
stops at 254 levels, so a deeper row would run its rollouts and then fail to be written."""
INTEGER_RANGE = (-(2**63), 2**64 - 1)
"""Integers a row may hold: what orjson writes (and what parquet's int64/uint64 columns hold)."""


@dataclass(frozen=True)
class Task:
    """One task: the raw row plus what the engine needs from it."""

    row: dict[str, Any]
    """The input row, untouched; verifier metadata lives here."""
    env_name: str
    messages: tuple[Message, ...]
    """The prompt as chat messages (Responses `developer` becomes `system`)."""
    tools: tuple[dict[str, Any], ...] | None
    """Tool schemas from the row (Responses format), or None to use the environment's."""
    index: int
    """Position of the task in its dataset; with the repeat index it identifies a rollout."""
    source: str = ""
    """`file:line` (or `rows[i]`) for error messages."""

    @property
    def create_params(self) -> dict[str, Any]:
        return self.row.get("responses_create_params") or {}

    def get(self, key: str, default: Any = None) -> Any:
        """A field of the row (verifier metadata such as `expected_answer`)."""
        return self.row.get(key, default)

    def __getitem__(self, key: str) -> Any:
        """`task["expected_answer"]`: a field of the row; raises KeyError naming the fields the row has."""
        try:
            return self.row[key]
        except KeyError:
            raise KeyError(f"task row {self.source or self.index} has no field {key!r}; its fields: {', '.join(sorted(self.row))}") from None

    def __contains__(self, key: object) -> bool:
        return key in self.row


TASK_KEY_LENGTH = 16
"""Hex digits of a `task_key`."""


def canonical_json(row: Mapping[str, Any]) -> str:
    """The row as JSON with sorted keys and no spaces: equal rows give equal text."""
    return json.dumps(row, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def task_key(row: Mapping[str, Any]) -> str:
    """A row's identity: the first `TASK_KEY_LENGTH` hex digits of the SHA-256 of its `canonical_json`. The one task key:
    TRL's dataset tags its prompts with it (and stores it in its `task_key` column), and `gym-bridge view` matches the
    tasks of two runs by it."""
    return hashlib.sha256(canonical_json(row).encode("utf-8")).hexdigest()[:TASK_KEY_LENGTH]


def routing_field(row: dict[str, Any]) -> str | None:
    """The field of a row that names its environment (`agent_ref.name`, `environment`, ...), or None."""
    ref = row.get("agent_ref")
    if isinstance(ref, dict) and ref.get("name"):
        return "agent_ref.name"
    if isinstance(ref, str) and ref:
        return "agent_ref"
    return next((key for key in ROUTING_KEYS[1:] if row.get(key)), None)


def routing_name(row: dict[str, Any]) -> str | None:
    """The environment name a row asks for, or None when it names none."""
    field = routing_field(row)
    if field is None:
        return None
    return str(row["agent_ref"]["name"] if field == "agent_ref.name" else row[field])


def _normalize_tools(raw: Any, *, source: str) -> tuple[dict[str, Any], ...]:
    if not isinstance(raw, list):
        raise DataError("must be a list of function schemas", source=source, field="responses_create_params.tools")
    tools = []
    for position, entry in enumerate(raw):
        field = f"responses_create_params.tools[{position}]"
        if not isinstance(entry, dict):
            raise DataError("must be an object", source=source, field=field)
        if entry.get("type") == "function" and isinstance(entry.get("function"), dict):
            entry = {"type": "function", **entry["function"]}  # chat-completions shape
        if entry.get("type", "function") != "function" or not entry.get("name"):
            raise DataError("must be {'type': 'function', 'name': ..., 'parameters': ...}", source=source, field=field)
        tools.append(entry)
    return tuple(tools)


def _check_writable(row: dict[str, Any], *, source: str) -> None:
    """Refuse, before any rollout, a row its record could not be written with: nested deeper than
    MAX_ROW_DEPTH, or an integer outside INTEGER_RANGE. Walks the row without recursion."""
    low, high = INTEGER_RANGE
    pending: list[tuple[str, Any, int]] = [(key, value, 1) for key, value in row.items()]
    while pending:
        path, value, depth = pending.pop()
        if isinstance(value, (dict, list, tuple)):
            if depth >= MAX_ROW_DEPTH:
                raise DataError(f"nested more than {MAX_ROW_DEPTH} levels deep: flatten it, or store it as a JSON string", source=source, field=path)
            entries = value.items() if isinstance(value, dict) else enumerate(value)
            pending.extend((f"{path}.{key}" if isinstance(value, dict) else f"{path}[{key}]", entry, depth + 1) for key, entry in entries)
        elif isinstance(value, int) and not isinstance(value, bool) and not low <= value <= high:
            raise DataError("an integer beyond 64 bits (a hash or 128-bit id?): store it as a string", source=source, field=path)


def parse_task(row: Any, *, index: int, source: str = "", default_env: str | None = None) -> Task:
    """Build a Task from a row; raises DataError naming the source and field."""
    if not isinstance(row, dict):
        raise DataError(f"a row must be a JSON object, got {type(row).__name__}", source=source)
    for key in RECORD_FIELDS:
        if key in row:
            raise DataError(
                f"{key!r} is a field gym_bridge adds to rollout records, so a task row cannot use it (its value would be "
                "overwritten): rename it or nest it (e.g. under verifier_metadata); to re-score stored rollouts use `gym-bridge verify`",
                source=source,
                field=key,
            )
    _check_writable(row, source=source)
    params = row.get("responses_create_params")
    if params is not None and not isinstance(params, dict):
        raise DataError("must be an object", source=source, field="responses_create_params")
    if params and params.get("input") not in (None, "", []):
        task_input, field = params["input"], "responses_create_params.input"
    elif row.get("messages"):
        task_input, field = row["messages"], "messages"
    elif isinstance(row.get("prompt"), (str, list)) and row.get("prompt"):
        task_input, field = row["prompt"], "prompt"
    else:
        raise DataError(
            "row has no input: give responses_create_params.input, messages or prompt",
            source=source,
            field="responses_create_params.input",
        )
    if not isinstance(task_input, (str, list)) or (isinstance(task_input, list) and not all(isinstance(m, dict) for m in task_input)):
        raise DataError("must be a string or a list of message objects", source=source, field=field)
    try:
        messages = to_messages(task_input)
    except ApiError as error:
        raise DataError(error.message, source=source, field=field) from None
    env_name = routing_name(row) or default_env
    if not env_name:
        raise DataError(
            "row names no environment: add agent_ref.name (or environment), or pass --env",
            source=source,
            field="agent_ref",
        )
    tools = None
    if params and params.get("tools"):
        tools = _normalize_tools(params["tools"], source=source)
    return Task(row=row, env_name=env_name, messages=tuple(messages), tools=tools, index=index, source=source)


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) for each non-blank line; raises DataError (file:line) on invalid UTF-8 or malformed JSON."""
    path = Path(path)
    with path.open("rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise DataError(
                    f"invalid UTF-8 (byte 0x{raw[error.start]:02x} at column {error.start + 1}); save the file as UTF-8",
                    source=f"{path}:{line_number}",
                ) from None
            if not line.strip():
                continue
            yield line_number, parse_json_line(line, source=f"{path}:{line_number}")


def parse_json_line(line: str, *, source: str) -> Any:
    """One JSON line; raises DataError naming `source` when it is malformed or nested too deeply to read."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as error:
        raise DataError(json_problem(error, line), source=source) from None
    except RecursionError:
        raise DataError(f"nested too deeply to read (a row may nest at most {MAX_ROW_DEPTH} levels)", source=source) from None


def json_problem(error: json.JSONDecodeError, line: str) -> str:
    """What is wrong with a malformed JSON `line`, said for a person: the column where the text stops being JSON,
    and the likely slip when the line ends inside a value (a missing closing brace) or goes on after one (a brace
    too many, or a missing opening one)."""
    text = line.rstrip()
    what = error.msg.removesuffix(" at")  # "Unterminated string starting at" (json's message ends where its column went)
    if error.pos >= len(text):
        return f"malformed JSON: the line ends before its JSON value does ({what}); is a closing quote, brace or bracket missing?"
    if error.msg == "Extra data":
        return (f"malformed JSON: a JSON value ends before column {error.pos + 1} and more text follows; is a closing brace "
                "too many, or an opening one missing?")
    return f"malformed JSON ({what} at column {error.pos + 1})"


def load_tasks(path: str | Path, *, default_env: str | None = None, limit: int | None = None, start_index: int = 0) -> list[Task]:
    """Parse a JSONL file of task rows. Every row is checked before any is returned."""
    tasks: list[Task] = []
    for line_number, row in iter_jsonl(path):
        if limit is not None and len(tasks) >= limit:
            break
        tasks.append(parse_task(row, index=start_index + len(tasks), source=f"{path}:{line_number}", default_env=default_env))
    return tasks
