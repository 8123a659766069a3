"""A rollout record as a reader sees it: the conversation, the token segments, the scores.

`transcript(record)` turns one JSONL record into `Turn`s (the task's input messages, then each
output item: assistant text, reasoning, tool calls with their arguments, tool outputs, user
replies) and `segments(record)` into runs of model (trained) and environment (masked) tokens.
`show` prints these; the HTML report embeds them. `select` filters and orders records for `show`, in one
pass that holds only the records it shows.
"""

from __future__ import annotations

import heapq
import json
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

from gym_bridge.core.errors import DataError
from gym_bridge.core.dialects.responses import item_text, to_chat_messages

SORT_KEYS = ("reward", "best", "latency", "turns", "tokens", "file")
"""`--sort` choices: `reward` ascending (worst first), `best` (highest reward first), `latency`, `turns` and
`tokens` largest first, `file` (the file's order)."""


@dataclass(frozen=True)
class Turn:
    """One entry of a conversation."""

    role: str
    """`system`, `user`, `assistant`, `reasoning`, `tool_call` or `tool_output`."""
    text: str
    name: str = ""
    """The tool's name (tool calls)."""
    call_id: str = ""


@dataclass(frozen=True)
class Segment:
    """A run of completion tokens of one kind."""

    kind: str
    """`model` (sampled, trained on) or `env` (tool outputs and templates, masked)."""
    ids: tuple[int, ...]
    logprobs: tuple[float, ...]


@dataclass(frozen=True)
class PolicyVersions:
    """The policy versions a rollout was sampled under, and how stale it was when trained (async trainers)."""

    calls: tuple[int | None, ...]
    """Per model call, the version its oldest token was sampled under (None where the backend did not say)."""
    oldest: int | None
    """The sample's version: the oldest of its tokens (`metrics.policy_version_min`)."""
    newest: int | None
    consumed: int | None
    """The trainer's version when the sample was handed to training (`metrics.consumed_version`)."""

    @property
    def staleness(self) -> int | None:
        """Trainer version at consumption minus the sample's oldest version, where both are known."""
        if self.consumed is None or self.oldest is None:
            return None
        return self.consumed - self.oldest

    @property
    def known(self) -> bool:
        return self.oldest is not None

    def summary(self) -> str:
        """`policy versions per call: 3, 3, 4 (oldest 3, newest 4)   consumed at version 5   staleness 2`."""
        per_call = ", ".join("?" if version is None else str(version) for version in self.calls)
        line = f"policy versions per call: {per_call or '-'} (oldest {self.oldest}, newest {self.newest})"
        if self.consumed is not None:
            line += f"   consumed at version {self.consumed}   staleness {self.staleness}"
        return line


def _int_or_none(value: Any) -> int | None:
    return value if type(value) is int else None


def policy_versions(record: Mapping[str, Any]) -> PolicyVersions:
    """The versions of a record: per call from the last item of each model call, the summary from `metrics`
    (recomputed from the calls where `metrics` lacks it)."""
    output = (record.get("response") or {}).get("output") or []
    calls = tuple(_int_or_none(item.get("policy_version")) for item in output
                  if isinstance(item, Mapping) and "generation_token_ids" in item)
    metrics = record.get("metrics") or {}
    known = [version for version in calls if version is not None]
    oldest = _int_or_none(metrics.get("policy_version_min"))
    newest = _int_or_none(metrics.get("policy_version_max"))
    return PolicyVersions(calls=calls, oldest=oldest if oldest is not None else min(known, default=None),
                          newest=newest if newest is not None else max(known, default=None),
                          consumed=_int_or_none(metrics.get("consumed_version")))


def _input_turns(row: Mapping[str, Any]) -> list[Turn]:
    params = row.get("responses_create_params") or {}
    task_input = params.get("input") if isinstance(params, Mapping) else None
    if task_input is None:
        task_input = row.get("messages") or row.get("prompt") or ""
    try:
        messages = to_chat_messages(task_input)
    except (ValueError, KeyError, TypeError, json.JSONDecodeError):
        return [Turn("user", json.dumps(task_input, ensure_ascii=False))]
    turns = []
    for message in messages:
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            turns.append(Turn("tool_call", json.dumps(function.get("arguments"), ensure_ascii=False), name=function.get("name", "")))
        if message.get("content") or not message.get("tool_calls"):
            turns.append(Turn("tool_output" if message["role"] == "tool" else message["role"], str(message.get("content", ""))))
    return turns


def _output_turn(item: Mapping[str, Any]) -> Turn:
    kind = item.get("type")
    if kind == "message":
        return Turn(str(item.get("role", "assistant")), item_text(dict(item)))
    if kind == "reasoning":
        return Turn("reasoning", item_text(dict(item)))
    if kind == "function_call":
        return Turn("tool_call", str(item.get("arguments", "")), name=str(item.get("name", "")), call_id=str(item.get("call_id", "")))
    if kind == "function_call_output":
        return Turn("tool_output", str(item.get("output", "")), call_id=str(item.get("call_id", "")))
    return Turn(str(kind), json.dumps(item, ensure_ascii=False))


def transcript(record: Mapping[str, Any]) -> list[Turn]:
    """The task's input messages, then the trajectory's items, in order."""
    output = (record.get("response") or {}).get("output") or []
    return [*_input_turns(record), *(_output_turn(item) for item in output)]


def tools_offered(record: Mapping[str, Any]) -> list[str]:
    """Names of the tools the row lists (the environment's own tools reach the prompt too; see the decoded prompt)."""
    params = record.get("responses_create_params") or {}
    tools = (params.get("tools") if isinstance(params, Mapping) else None) or record.get("tools") or []
    return [str(tool.get("name") or tool.get("function", {}).get("name", "?")) for tool in tools if isinstance(tool, Mapping)]


def segments(record: Mapping[str, Any]) -> list[Segment]:
    """The completion tokens as alternating runs of model and environment tokens."""
    tokens = record.get("tokens") or {}
    ids, mask = tokens.get("completion_ids") or [], tokens.get("completion_mask") or []
    logprobs = tokens.get("completion_logprobs") or [0.0] * len(ids)
    runs: list[Segment] = []
    start = 0
    for position in range(1, len(ids) + 1):
        if position == len(ids) or mask[position] != mask[start]:
            runs.append(Segment("model" if mask[start] else "env", tuple(ids[start:position]), tuple(logprobs[start:position])))
            start = position
    return runs


def _sort_key(name: str) -> Any:
    def metric(record: Mapping[str, Any], key: str) -> float:
        return float((record.get("metrics") or {}).get(key) or 0)

    keys: dict[str, Any] = {
        "reward": lambda record: float(record.get("reward") or 0.0),
        "best": lambda record: -float(record.get("reward") or 0.0),
        "latency": lambda record: -metric(record, "latency_s"),
        "turns": lambda record: -metric(record, "turns"),
        "tokens": lambda record: -len((record.get("tokens") or {}).get("completion_ids") or []),
    }
    return keys[name]


@dataclass(frozen=True)
class Selection:
    """The rollouts chosen to show, in order, and how many the filters selected of how many read."""

    chosen: list[tuple[int, Mapping[str, Any]]]
    """(position in the file, record), at most the `limit` asked."""
    selected: int
    total: int


def select(records: Iterable[Mapping[str, Any]], *, envs: Sequence[str] = (), failed: bool = False,
           sort: str = "file", limit: int = 0) -> Selection:
    """The first `limit` (0: all) of the records of `envs` (all when empty), only failed ones with
    `failed`, ordered by `sort` (one of `SORT_KEYS`; ties keep the file's order). Reads `records` once
    and holds at most `limit` of them (a bounded heap when sorting), so `show` takes a file of any size
    from `iter_rollouts`. Raises DataError for an unknown sort key or an environment no record has."""
    if sort not in SORT_KEYS:
        raise DataError(f"--sort must be one of {', '.join(SORT_KEYS)}, got {sort!r}")
    present: set[str] = set()
    counts = [0, 0]  # read, selected

    def matching() -> Iterator[tuple[int, Mapping[str, Any]]]:
        for position, record in enumerate(records):
            counts[0] += 1
            env = str(record.get("env"))
            present.add(env)
            if (not envs or env in envs) and (not failed or record.get("failure_kind")):
                counts[1] += 1
                yield position, record

    stream = matching()
    if sort == "file":
        chosen = list(islice(stream, limit or None))
        deque(stream, maxlen=0)  # counted, not kept
    else:
        key = _sort_key(sort)
        chosen = heapq.nsmallest(limit, stream, key=lambda entry: key(entry[1])) if limit else sorted(stream, key=lambda entry: key(entry[1]))
    missing = [env for env in envs if env not in present]
    if missing:
        raise DataError(f"no rollouts of environment(s) {', '.join(missing)}; the file has {', '.join(sorted(present)) or 'none'}")
    return Selection(chosen=chosen, selected=counts[1], total=counts[0])


def load_rollouts(path: str) -> list[dict[str, Any]]:
    """The records of a rollout file. Raises DataError naming the file (and line) when it is missing,
    malformed, or holds lines that are not rollout records (no `response`)."""
    from pathlib import Path

    from gym_bridge.core.rollout_file import read_records

    if not Path(path).is_file():
        raise DataError("file not found", source=str(path))
    records = read_records(path)
    for line, record in enumerate(records, start=1):
        if not isinstance(record, dict) or "response" not in record:
            raise DataError("is not a rollout record (it has no 'response'); pass the output of gym-bridge eval",
                            source=f"{path}, record {line}")
    return records


def iter_rollouts(path: str) -> Iterator[dict[str, Any]]:
    """The records of a rollout file one at a time (for files too large to hold: the HTML report).
    A torn final line (a killed writer) is ignored; raises DataError as `load_rollouts` does."""
    from pathlib import Path

    from gym_bridge.core.rollout_file import load_line

    if not Path(path).is_file():
        raise DataError("file not found", source=str(path))
    with open(path, "rb") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = load_line(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                if not line.endswith(b"\n"):
                    return
                raise DataError("malformed JSON (or invalid UTF-8) in a rollout file", source=f"{path}:{line_number}") from None
            if not isinstance(record, dict) or "response" not in record:
                raise DataError("is not a rollout record (it has no 'response'); pass the output of gym-bridge eval",
                                source=f"{path}:{line_number}")
            yield record
