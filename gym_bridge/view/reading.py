"""A rollout record as a reader sees it: the conversation, the runs of model and environment tokens, the scores.

`record_turns(record)` turns one JSONL record into `Turn`s (the task's input messages, then each
output item: assistant text, reasoning, tool calls with their arguments, tool outputs, user
replies) and `token_runs(record)` into runs of model (trained) and environment (masked) tokens.
`show` prints these; the HTML report embeds them. `select` filters and orders records for `show`, in one
pass that holds only the records it shows.
"""

from __future__ import annotations

import heapq
import json
import math
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

from gym_bridge.core.errors import DataError
from gym_bridge.core.conversation import tool_calls_of
from gym_bridge.core.dialects.chat import ApiError
from gym_bridge.core.dialects.responses import to_messages
from gym_bridge.core.items import item_text

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
class TokenRun:
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
        messages = to_messages(task_input)
    except (ApiError, ValueError, KeyError, TypeError, AttributeError):  # not messages: shown as the JSON it is
        return [Turn("user", json.dumps(task_input, ensure_ascii=False))]
    turns = []
    for message in messages:
        for call in tool_calls_of(message):
            function = call["function"]
            turns.append(Turn("tool_call", function["arguments"], name=function["name"]))
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


def record_turns(record: Mapping[str, Any]) -> list[Turn]:
    """The task's input messages, then the trajectory's items, in order."""
    output = (record.get("response") or {}).get("output") or []
    return [*_input_turns(record), *(_output_turn(item) for item in output)]


def tools_offered(record: Mapping[str, Any]) -> list[str]:
    """Names of the tools the row lists (the environment's own tools reach the prompt too; see the decoded prompt)."""
    params = record.get("responses_create_params") or {}
    tools = (params.get("tools") if isinstance(params, Mapping) else None) or record.get("tools") or []
    names = []
    for tool in (tool for tool in tools if isinstance(tool, Mapping)):
        function = tool.get("function")
        names.append(str(tool.get("name") or (function.get("name") if isinstance(function, Mapping) else None) or "?"))
    return names


def token_runs(record: Mapping[str, Any]) -> list[TokenRun]:
    """The completion tokens as alternating runs of model and environment tokens."""
    tokens = record.get("tokens") or {}
    ids, mask = tokens.get("completion_ids") or [], tokens.get("completion_mask") or []
    logprobs = tokens.get("completion_logprobs") or [0.0] * len(ids)
    runs: list[TokenRun] = []
    start = 0
    for position in range(1, len(ids) + 1):
        if position == len(ids) or mask[position] != mask[start]:
            runs.append(TokenRun("model" if mask[start] else "env", tuple(ids[start:position]), tuple(logprobs[start:position])))
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


@dataclass(frozen=True)
class Skipped:
    """A line of a rollout file that a view left out, and why."""

    source: str
    """`file:line`."""
    reason: str

    def __str__(self) -> str:
        return f"skipped {self.source}: {self.reason}"


def require_some(skipped: Sequence[Skipped], read: int) -> None:
    """Raises DataError when lines were skipped and none was read: the input holds no rollout a view can use."""
    if skipped and not read:
        raise DataError(f"no readable rollout records: all {len(skipped)} lines were skipped; the first, {skipped[0].source}: "
                        f"{skipped[0].reason}")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


MAX_TOKEN_ID = 2**31 - 1
"""Above any vocabulary; tokenizers fail on ids past 64 bits."""


def _ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(token, int) and not isinstance(token, bool) and 0 <= token <= MAX_TOKEN_ID
                                           for token in value)


def _token_problem(tokens: Any) -> str | None:
    if not isinstance(tokens, dict):
        return f"tokens is a {type(tokens).__name__}, not an object"
    for key in ("prompt_ids", "completion_ids"):
        if tokens.get(key) is not None and not _ids(tokens[key]):
            return f"tokens.{key} is not a list of token ids (integers from 0 to {MAX_TOKEN_ID})"
    ids, mask, logprobs = tokens.get("completion_ids") or [], tokens.get("completion_mask") or [], tokens.get("completion_logprobs")
    if not isinstance(mask, list) or any(flag not in (0, 1) or isinstance(flag, float) for flag in mask):
        return "tokens.completion_mask is not a list of 0 and 1"
    if len(mask) != len(ids):
        return f"tokens.completion_mask has {len(mask)} entries for {len(ids)} completion ids"
    if logprobs is not None:
        if not isinstance(logprobs, list) or not all(_finite(value) for value in logprobs):
            return "tokens.completion_logprobs is not a list of finite numbers (null or NaN entries)"
        if len(logprobs) != len(ids):
            return f"tokens.completion_logprobs has {len(logprobs)} entries for {len(ids)} completion ids"
    return None


def _parts_problem(parts: Any, where: str) -> str | None:
    if isinstance(parts, str) or parts is None:
        return None
    if not isinstance(parts, list) or not all(isinstance(part, dict) and isinstance(part.get("text", ""), str) for part in parts):
        return f"{where} is not a string or a list of parts with text"
    return None


def _output_problem(output: Any) -> str | None:
    if not isinstance(output, list):
        return f"response.output is a {type(output).__name__}, not a list"
    for position, item in enumerate(output):
        where = f"response.output[{position}]"
        if not isinstance(item, dict) or not isinstance(item.get("type"), str):
            return f"{where} is not an item (an object with a string 'type')"
        problem = _parts_problem(item.get("content"), f"{where}.content") or _parts_problem(item.get("summary"), f"{where}.summary")
        if problem:
            return problem
    return None


_OPTIONAL_TYPES: dict[str, tuple[type, ...]] = {
    "env": (str,), "task_index": (int,), "repeat_index": (int,), "mask_sample": (bool,), "failure_kind": (str,),
    "reward_components": (dict,), "metrics": (dict,), "responses_create_params": (dict,),
}
_METRIC_NUMBERS = ("turns", "tool_calls", "parse_errors", "unparsed_tool_calls", "latency_s")


def record_problem(record: Any) -> str | None:
    """Why `show`, `view` and `export` cannot read `record` (a loaded JSON line), or None when they can:
    the fields they read must have their record types (a finite number reward, a mask and log-probs as long as
    the completion ids, output items that are objects, ...)."""
    if not isinstance(record, dict):
        return f"is a JSON {type(record).__name__}, not a record (a rollout file holds one JSON object a line)"
    response = record.get("response")
    if not isinstance(response, dict):
        return "is not a rollout record (it has no 'response' object); pass the output of gym-bridge eval"
    for key, types in _OPTIONAL_TYPES.items():
        value = record.get(key)
        if value is not None and (not isinstance(value, types) or (isinstance(value, bool) and bool not in types)):
            return f"{key} is a {type(value).__name__} ({_short(value)}), not a {' or '.join(kind.__name__ for kind in types)}"
    if not _finite(record.get("reward")):
        return f"reward is {_short(record.get('reward'))}, not a finite number"
    components = record.get("reward_components") or {}
    if not all(_finite(value) for value in components.values()):
        return "reward_components holds a value that is not a finite number"
    metrics = record.get("metrics") or {}
    for key in _METRIC_NUMBERS:
        if metrics.get(key) is not None and not _finite(metrics[key]):
            return f"metrics.{key} is {_short(metrics[key])}, not a finite number"
    if metrics.get("verify") is not None and not isinstance(metrics["verify"], dict):
        return "metrics.verify is not an object"
    tools = (record.get("responses_create_params") or {}).get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(tool, dict) for tool in tools)):
        return "responses_create_params.tools is not a list of objects"
    if not isinstance(response.get("model") or "", str) or not isinstance(response.get("usage") or {}, dict):
        return "response.model is not a string, or response.usage not an object"
    if record.get("tokens") is not None and (problem := _token_problem(record["tokens"])):
        return problem
    return _output_problem(response.get("output") or [])


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=True, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _text_problem(line: bytes, record: Any) -> str | None:
    """What JSON's text allows but a report or export cannot write: a lone UTF-16 surrogate escape, NaN or Infinity."""
    if b"\\ud" in line.lower():
        try:
            json.dumps(record, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as error:
            return f"holds a lone surrogate escape (\\u{ord(str(error.object)[error.start]):04x}): not valid Unicode text"
    if b"NaN" in line or b"Infinity" in line:
        try:
            json.dumps(record, allow_nan=False)
        except ValueError:
            return "holds NaN or Infinity, which JSON does not allow"
    return None


def load_rollouts(path: str) -> list[dict[str, Any]]:
    """The records of a rollout file. Raises DataError naming the file (and line) when it is missing,
    malformed, or holds lines that are not rollout records (no `response`)."""
    return list(iter_rollouts(path))


def iter_rollouts(path: str, *, skipped: list[Skipped] | None = None) -> Iterator[dict[str, Any]]:
    """The records of a rollout file one at a time (for files too large to hold: the HTML report).
    A torn final line (a killed writer) is ignored. A line that is not JSON, or not a record the views can
    read (`record_problem`), raises DataError naming file:line; with a `skipped` list it is appended there
    instead and the rest is read. Raises DataError for a missing file."""
    return (record for _, record in numbered_rollouts(path, skipped=skipped))


def numbered_rollouts(path: str, *, skipped: list[Skipped] | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) for each record `iter_rollouts` gives."""
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
                problem = record_problem(record) or _text_problem(line, record)
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                if not line.endswith(b"\n"):
                    return
                problem = "malformed JSON (or invalid UTF-8) in a rollout file"
            if problem is None:
                yield line_number, record
            elif skipped is None:
                raise DataError(problem, source=f"{path}:{line_number}")
            else:
                skipped.append(Skipped(f"{path}:{line_number}", problem))
