"""Tool-call health: does the model call the tools it is offered, and can its calls be read?

The costliest silent failure of a tool-using run is a model that never calls a tool: every
rollout is scored, nothing fails, and no trainer alarms on it. This module computes, per
environment and per model family, the share of rollouts with a tool call, the parse-error rate,
the share of rollouts holding a call the parser could not read, and the share ending without an
answer turn; `ToolCallAlarm` watches records as they stream and warns once when an environment
that offers tools sees no call over its first N rollouts, or when unreadable calls pass a threshold.
Records may be `RolloutRecord`s or their JSONL dicts.
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["HealthSettings", "ToolCallAlarm", "format_health", "model_family", "offers_tools", "tool_call_health"]

logger = logging.getLogger("gym_bridge.health")

_SIZE = re.compile(r"^\d+(\.\d+)?[bmk]$|^a\d+(\.\d+)?b$|^\d+x\d+b$", re.IGNORECASE)


@dataclass(frozen=True)
class HealthSettings:
    """When the tool-call alarm fires (`eval --no-tool-call-after`, `--max-parse-error-rate`; the trainer adapters' options)."""

    no_tool_call_after: int = 20
    """Warn when an environment that offers tools has seen this many rollouts and not one tool call (0: never)."""
    max_parse_error_rate: float = 0.2
    """Warn when the share of tool calls that could not be read passes this (malformed calls plus
    turns holding an unparsed call, over all attempted calls)."""
    min_attempts: int = 10
    """Attempted calls an environment needs before the parse-error rate is judged."""


def model_family(model: str) -> str:
    """A model's family from its name: `Qwen/Qwen3-8B-Instruct` -> `qwen3`, `SmolLM2-135M-Instruct (embedded)` -> `smollm2`.

    The name's last path part, lowercased, up to its size (`8b`, `135m`); the whole name when it has no size."""
    name = model.split(" (", 1)[0].rstrip("/").rsplit("/", 1)[-1].lower()
    parts = name.split("-")
    for position, part in enumerate(parts):
        if position and _SIZE.match(part):
            return "-".join(parts[:position])
    return name or "unknown"


def _row(record: Any) -> Mapping[str, Any]:
    return record if isinstance(record, Mapping) else record.to_dict()


def offers_tools(row: Mapping[str, Any]) -> bool:
    """Whether the rollout's model was offered tools: the row lists some, or its environment defines some."""
    params = row.get("responses_create_params") or {}
    if (isinstance(params, Mapping) and params.get("tools")) or row.get("tools"):
        return True
    from gym_bridge.core.errors import GymBridgeError
    from gym_bridge.core.registry import get_environment

    for name in (row.get("env"), row.get("env_path")):
        if name:
            try:
                return bool(get_environment(str(name)).tool_specs())
            except (GymBridgeError, ValueError, ImportError):
                continue
    return False


@dataclass
class _Counts:
    rollouts: int = 0
    offered: int = 0
    with_call: int = 0
    tool_calls: int = 0
    parse_errors: int = 0
    unparsed: int = 0
    with_unparsed: int = 0
    no_answer: int = 0

    def add(self, row: Mapping[str, Any], *, tools_offered: bool) -> None:
        metrics = row.get("metrics") or {}
        calls = int(metrics.get("tool_calls", 0) or 0)
        unparsed = int(metrics.get("unparsed_tool_calls", 0) or 0)
        self.rollouts += 1
        self.offered += tools_offered
        self.with_call += calls > 0
        self.tool_calls += calls
        self.parse_errors += int(metrics.get("parse_errors", 0) or 0)
        self.unparsed += unparsed
        self.with_unparsed += unparsed > 0
        self.no_answer += metrics.get("finish_reason") != "answer" and not row.get("failure_kind")

    @property
    def attempts(self) -> int:
        """Calls the model tried to make: those read (malformed ones included: `tool_calls` counts them) and those not seen."""
        return self.tool_calls + self.unparsed

    def parse_error_rate(self) -> float:
        return (self.parse_errors + self.unparsed) / self.attempts if self.attempts else 0.0

    def to_dict(self) -> dict[str, Any]:
        count = max(1, self.rollouts)
        return {
            "rollouts": self.rollouts,
            "offers_tools": self.offered > 0,
            "tool_call_rate": self.with_call / count,
            "tool_calls_per_rollout": self.tool_calls / count,
            "parse_error_rate": self.parse_error_rate(),
            "attempts": self.attempts,
            "parse_errors": self.parse_errors,
            "unparsed_tool_calls": self.unparsed,
            "unparsed_call_rate": self.with_unparsed / count,
            "no_answer_rate": self.no_answer / count,
        }


def tool_call_health(records: Iterable[Any], *, tools_offered: Callable[[Mapping[str, Any]], bool] = offers_tools) -> dict[str, Any]:
    """`{"per_env": {env: block}, "per_model_family": {family: block}}`, each block holding `rollouts`,
    `offers_tools`, `tool_call_rate` (share of rollouts with at least one call), `tool_calls_per_rollout`,
    `parse_error_rate` (unreadable calls over attempted calls), `unparsed_call_rate` (share of rollouts with a
    turn taken as an answer although it held a call marker) and `no_answer_rate` (share of unfailed rollouts
    that ended without an answer turn: out of turns or tokens)."""
    per_env: dict[str, _Counts] = defaultdict(_Counts)
    per_family: dict[str, _Counts] = defaultdict(_Counts)
    offered: dict[str, bool] = {}
    for record in records:
        row = _row(record)
        env = str(row.get("env"))
        if env not in offered:
            offered[env] = tools_offered(row)
        family = model_family(str((row.get("response") or {}).get("model") or ""))
        per_env[env].add(row, tools_offered=offered[env])
        per_family[family].add(row, tools_offered=offered[env])
    return {
        "per_env": {name: counts.to_dict() for name, counts in sorted(per_env.items())},
        "per_model_family": {name: counts.to_dict() for name, counts in sorted(per_family.items())},
    }


@dataclass
class ToolCallAlarm:
    """Watches records as they finish; `observe` returns (and logs as a warning) each alarm once.

    `alarms` keeps every message raised, for the run's summary."""

    settings: HealthSettings = field(default_factory=HealthSettings)
    tools_offered: Callable[[Mapping[str, Any]], bool] = offers_tools
    alarms: list[str] = field(default_factory=list)
    _counts: dict[str, _Counts] = field(default_factory=lambda: defaultdict(_Counts))
    _offered: dict[str, bool] = field(default_factory=dict)
    _fired: set[tuple[str, str]] = field(default_factory=set)

    def observe(self, record: Any) -> list[str]:
        """Count one record; returns the alarms it raised (usually none)."""
        row = _row(record)
        env = str(row.get("env"))
        if env not in self._offered:
            self._offered[env] = self.tools_offered(row)
        counts = self._counts[env]
        counts.add(row, tools_offered=self._offered[env])
        raised = []
        after = self.settings.no_tool_call_after
        if self._offered[env] and after > 0 and counts.rollouts >= after and counts.attempts == 0:
            raised += self._fire(env, "no_tool_call", (
                f"environment {env!r} offers tools, but none of its first {counts.rollouts} rollouts called one: "
                "check the tool instructions the model sees (gym-bridge show), --tool-parser, or the model"))
        rate = counts.parse_error_rate()
        if counts.attempts >= self.settings.min_attempts and rate > self.settings.max_parse_error_rate:
            raised += self._fire(env, "parse_errors", (
                f"environment {env!r}: {rate:.0%} of {counts.attempts} tool calls could not be parsed "
                f"(more than {self.settings.max_parse_error_rate:.0%}): check --tool-parser against the model's call syntax"))
        return raised

    def _fire(self, env: str, kind: str, message: str) -> list[str]:
        if (env, kind) in self._fired:
            return []
        self._fired.add((env, kind))
        self.alarms.append(message)
        logger.warning("TOOL-CALL ALARM: %s", message)
        return [message]


def parse_error_counts(malformed: int, unparsed: int, *, attempts: int | None = None) -> str:
    """What a parse-error rate is made of, in the words every report uses: `N [of A] tool calls could not be
    parsed: M malformed, K in a syntax the parser does not read`."""
    counted = f"{malformed + unparsed}" if attempts is None else f"{malformed + unparsed} of {attempts}"
    return f"{counted} tool calls could not be parsed: {malformed} malformed, {unparsed} in a syntax the parser does not read"


def _made_of(block: Mapping[str, Any]) -> str:
    if not block.get("attempts"):
        return ""
    return f" ({parse_error_counts(block['parse_errors'], block['unparsed_tool_calls'], attempts=block['attempts'])})"


def format_health(health: Mapping[str, Any], *, alarms: Iterable[str] = ()) -> str:
    """Lines for a run's summary: per environment that offers tools, its call and parse-error rates; then the alarms."""
    lines = []
    for env, block in health.get("per_env", {}).items():
        if block["offers_tools"]:
            lines.append(
                f"tool calls [{env}]: {block['tool_call_rate']:.0%} of rollouts call a tool "
                f"({block['tool_calls_per_rollout']:.2f} per rollout), parse errors {block['parse_error_rate']:.0%}{_made_of(block)}, "
                f"unparsed calls in {block['unparsed_call_rate']:.0%}, no answer turn in {block['no_answer_rate']:.0%}")
    lines += [f"ALARM: {message}" for message in alarms]
    return "\n".join(lines)
