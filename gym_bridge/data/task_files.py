"""Task-row files: check them, generate them, mix them (`gym-bridge data validate|prepare|mix`).

`validate_file` checks every row of a JSONL file against the environment it routes to (input,
routing, tool schemas, and the verifier fields the environment declares with `row_schema` /
`validate_row`) and reports every problem with file:line and field. `prepare` calls an
environment's `prepare_rows` generator; `mix_files` draws a seeded, shuffled multi-environment file.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from gym_bridge.core.environment import Environment, row_problems
from gym_bridge.core.errors import ConfigError, DataError, GymBridgeError, UnknownEnvironmentError
from gym_bridge.core.mixing import check_weights, weighted_mix
from gym_bridge.core.output_file import replaced_atomically
from gym_bridge.core.registry import get_environment, known_environments, resolve_tasks
from gym_bridge.core.trust import DEFAULT_TRUST, TrustSettings
from gym_bridge.core.task import ROUTING_KEYS, Task, iter_jsonl, parse_json_line, parse_task


@dataclass(frozen=True)
class Problem:
    """One problem found in a task file."""

    source: str
    """`file:line`."""
    field: str
    message: str

    def __str__(self) -> str:
        return ": ".join(part for part in (self.source, self.field, self.message) if part)


@dataclass(frozen=True)
class ValidationReport:
    """What `validate_file` found."""

    path: Path
    rows: int
    """Non-blank lines read."""
    problems: list[Problem]
    rows_per_env: dict[str, int] = field(default_factory=dict)
    """Rows that parsed, by the environment's canonical name."""
    warnings: list[Problem] = field(default_factory=list)
    """What valid rows do that a reader of shared data should know (a row naming the command its harness runs)."""

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        """One line for `data validate`: `3 rows (math 2, mcqa 1): 1 problem(s)`; the parenthesis only when a row routed."""
        envs = ", ".join(f"{name} {count}" for name, count in self.rows_per_env.items())
        verdict = "ok" if self.ok else f"{len(self.problems)} problem(s)"
        verdict += f", {len(self.warnings)} warning(s)" if self.warnings else ""
        return f"{self.rows} {'row' if self.rows == 1 else 'rows'}{f' ({envs})' if envs else ''}: {verdict}"


def _routing_field(row: dict[str, Any]) -> str:
    if isinstance(row.get("agent_ref"), dict):
        return "agent_ref.name"
    return next((key for key in ROUTING_KEYS if row.get(key)), "agent_ref")


def check_row(row: Any, *, source: str, default_env: str | None = None,
              trust: TrustSettings = DEFAULT_TRUST) -> tuple[type[Environment] | None, list[Problem]]:
    """The environment a row routes to (None if it routes nowhere) and every problem with the row, `trust` saying
    which module paths it may name and what it may run (`row_problems`)."""
    try:
        task = parse_task(row, index=0, source=source, default_env=default_env)
    except DataError as error:
        return None, [Problem(source, error.field, error.message)]
    try:
        env_class = get_environment(task.env_name, trust)
    except UnknownEnvironmentError as error:
        return None, [Problem(source, _routing_field(task.row), str(error))]
    problems = []
    try:
        resolve_tasks([task], trust)
    except DataError as error:
        problems.append(Problem(source, error.field, error.message))
    try:
        found = row_problems(env_class, task.row, trust)
    except Exception as error:  # a bug in an environment's checks must not hide the other rows' problems
        found = []
        problems.append(Problem(source, "(row)", f"{env_class.__name__}.validate_row crashed: {type(error).__name__}: {error}"))
    problems.extend(Problem(source, problem.field, f"{problem.message} (environment {env_class.name!r})") for problem in found)
    return env_class, problems


def validate_file(path: str | Path, *, default_env: str | None = None) -> ValidationReport:
    """Check every row of a JSONL task file; never stops at the first problem, and never raises:
    a file that cannot be read (missing, a directory, UTF-16) is one problem naming it."""
    path = Path(path)
    problems: list[Problem] = []
    warnings: list[Problem] = []
    per_env: Counter[str] = Counter()
    rows = 0
    unreadable = _unreadable(path)
    if unreadable:
        return ValidationReport(path=path, rows=0, problems=[Problem(str(path), "", unreadable)])
    with path.open("rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            source = f"{path}:{line_number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                rows += 1
                problems.append(Problem(source, "", f"invalid UTF-8 (byte 0x{raw[error.start]:02x} at column {error.start + 1}); save the file as UTF-8"))
                continue
            if not line.strip():
                continue
            rows += 1
            try:
                row = parse_json_line(line, source=source)
            except DataError as error:
                problems.append(Problem(source, "", error.message))
                continue
            env_class, found = check_row(row, source=source, default_env=default_env)
            problems.extend(found)
            if env_class is not None:
                per_env[env_class.name] += 1
                if not found:
                    warnings.extend(_row_warnings(row, env_class, source))
    if rows == 0:
        problems.append(Problem(str(path), "", "holds no rows"))
    return ValidationReport(path=path, rows=rows, problems=problems, rows_per_env=dict(sorted(per_env.items())), warnings=warnings)


def _row_warnings(row: dict[str, Any], env_class: type[Environment], source: str) -> list[Problem]:
    """A valid row that names the command its harness runs (its environment allows that): say so."""
    if "harness" not in row:
        return []
    from gym_bridge.capture.environment import HarnessEnvironment, row_command

    if not issubclass(env_class, HarnessEnvironment) or row_command(row) is None:
        return []
    return [Problem(source, "harness.command", f"names the command its harness runs ({env_class.name!r} allows rows to): "
                                               "it runs with your permissions, so use this file only if you trust it")]


_BYTE_ORDER_MARKS = {b"\xff\xfe\x00\x00": "UTF-32", b"\x00\x00\xfe\xff": "UTF-32", b"\xff\xfe": "UTF-16", b"\xfe\xff": "UTF-16"}


def _unreadable(path: Path) -> str | None:
    """Why `path` cannot be read as a JSONL file at all, or None."""
    if path.is_dir():
        return "is a directory; give the JSONL files in it"
    try:
        with path.open("rb") as handle:
            start = handle.read(4)
    except OSError as error:
        return f"cannot be read: {error.strerror or error}"
    encoding = next((name for mark, name in _BYTE_ORDER_MARKS.items() if start.startswith(mark)), None)
    return f"is {encoding} (it starts with a byte-order mark); save it as UTF-8" if encoding else None


def generator_names() -> list[str]:
    """The registered environments that can generate rows (`prepare_rows`)."""
    return [name for name, env_class in known_environments().items() if callable(getattr(env_class, "prepare_rows", None))]


def prepare(env_name: str, *, split: str = "train", size: int = 100, seed: int = 0, **options: Any) -> list[dict[str, Any]]:
    """Rows generated by an environment's `prepare_rows`, each checked like `validate_file` checks.

    Raises GymBridgeError when the environment has no generator (naming those that have one) or
    the generator rejects the options, and DataError when a generated row is invalid.
    """
    env_class = get_environment(env_name)
    generate = getattr(env_class, "prepare_rows", None)
    if not callable(generate):
        raise ConfigError(
            f"environment {env_class.name!r} has no row generator (prepare_rows); "
            f"environments with one: {', '.join(generator_names()) or 'none'}"
        )
    if split not in ("train", "validation"):
        raise ConfigError(f"--split must be train or validation, got {split!r}")
    if size < 1:
        raise ConfigError(f"--size must be at least 1, got {size}")
    try:
        rows = generate(split=split, size=size, seed=seed, **options)
    except (ValueError, TypeError) as error:  # bad options: a usage error, reported as such
        if isinstance(error, GymBridgeError):
            raise
        raise ConfigError(f"{env_class.name} prepare_rows: {error}") from None
    for position, row in enumerate(rows):
        _, problems = check_row(row, source=f"{env_class.name}.prepare_rows()[{position}]", default_env=env_class.name)
        if problems:
            raise DataError("; ".join(str(problem) for problem in problems))
    return list(rows)


def read_task_rows(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """(`file:line`, row) for each row of a task file; every row must parse and route.

    Raises DataError (file:line: field) or UnknownEnvironmentError.
    """
    path = Path(path)
    if not path.exists():
        raise DataError("file not found", source=str(path))
    entries: list[tuple[str, dict[str, Any]]] = []
    tasks: list[Task] = []
    for line_number, row in iter_jsonl(path):
        source = f"{path}:{line_number}"
        tasks.append(parse_task(row, index=len(tasks), source=source))
        entries.append((source, row))
    if not entries:
        raise DataError("holds no rows", source=str(path))
    resolve_tasks(tasks)
    return entries


def mix_files(paths: Sequence[str | Path], *, weights: Sequence[float] | None = None, seed: int = 0, num_rows: int | None = None) -> list[dict[str, Any]]:
    """One shuffled list of rows from several task files.

    Without `weights` every row of every file appears once; with one weight per file,
    `num_rows` rows (default: as many as the files hold together) are drawn in those
    proportions, each file in seeded shuffled passes. Every row must name its environment
    (a mixed file has no default). Raises DataError / UnknownEnvironmentError / ValueError.
    """
    sources = [[row for _, row in read_task_rows(path)] for path in paths]
    rng = random.Random(seed)
    if weights is None:
        if num_rows is not None:
            raise ValueError("num_rows needs weights")
        mixed = [row for rows in sources for row in rows]
        rng.shuffle(mixed)
        return mixed
    check_weights(weights, len(sources))
    total = num_rows if num_rows is not None else sum(len(rows) for rows in sources)
    return weighted_mix(sources, list(weights), total, rng)


def write_rows(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Write rows as JSONL (UTF-8, one object per line), creating the folder and replacing `path`
    atomically (an interrupted write leaves the old file); returns the path."""
    path = Path(path)
    with replaced_atomically(path) as temp, temp.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path
