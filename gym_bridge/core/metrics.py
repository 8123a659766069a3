"""Summary metrics of a set of rollout records: what `gym-bridge eval` prints and saves.

Mean reward counts every rollout that was not masked; pass@k uses the unbiased estimator
over each task's repeats (a repeat passes when its reward is at least `pass_threshold`);
failures are counted by kind, and their most frequent reasons are listed with an example record;
token counts separate model and environment tokens; `parse_errors` and `unparsed_tool_calls` total
the tool calls the parser could not read. A run over 2 or more model replicas gets a line per
replica (episodes, calls, errors) and the episode-affinity hit rate. With no scored rollout, mean reward and pass@k are None
(`n/a` in the table), not 0.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from typing import Any, Iterable, Mapping

from gym_bridge.core.health import format_health, parse_error_counts

TOP_REASONS = 5
"""Failure reasons listed under the table (the records hold all of them)."""
_REQUEST_TIMEOUT = re.compile(r"request timed out after (\d+(?:\.\d+)?) s")
"""How the remote policy words a model request that got no answer in time (it is not retried)."""
_DEADLINE = re.compile(r"rollout exceeded its deadline of (\d+(?:\.\d+)?) s")
"""How the engine words a rollout that ran past `deadline_s`."""
_ELAPSED = re.compile(r"(?<=\bin )\d+(?:\.\d+)? s\b")
"""An elapsed time in a reason (`4 attempts failed in 12.3 s`): reasons that differ only in it count as one."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn from n (c of them correct) is correct."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def _rows(records: Iterable[Any]) -> list[Mapping[str, Any]]:
    return [record if isinstance(record, Mapping) else record.to_dict() for record in records]


def repeats_per_task(records: Iterable[Any]) -> int:
    """The most rollouts any task has (failed ones included): the run's --num-repeats."""
    counts = Counter((row.get("env"), row.get("task_index")) for row in _rows(records))
    return max(counts.values(), default=1)


def _block(rows: list[Mapping[str, Any]], *, pass_threshold: float, num_repeats: int) -> dict[str, Any]:
    scored = [row for row in rows if not row.get("mask_sample")]
    failures = Counter(row["failure_kind"] for row in rows if row.get("failure_kind"))
    by_task: dict[Any, list[bool]] = defaultdict(list)
    for row in scored:
        by_task[(row.get("env"), row.get("task_index"))].append(row["reward"] >= pass_threshold)
    pass_k: dict[str, float | None] = {}
    for k in sorted({1, num_repeats}):
        values = [pass_at_k(len(v), sum(v), k) for v in by_task.values() if len(v) >= k]
        pass_k[f"pass@{k}"] = sum(values) / len(values) if values else None
    model_tokens = sum(sum(row["tokens"]["completion_mask"]) for row in rows if "tokens" in row)
    completion_tokens = sum(len(row["tokens"]["completion_ids"]) for row in rows if "tokens" in row)
    prompt_tokens = sum(len(row["tokens"]["prompt_ids"]) for row in rows if "tokens" in row)
    def total(name: str) -> int:
        return sum(int(row.get("metrics", {}).get(name, 0) or 0) for row in rows)

    return {
        "rollouts": len(rows),
        "scored": len(scored),
        "mean_reward": sum(row["reward"] for row in scored) / len(scored) if scored else None,
        **pass_k,
        "failed": sum(failures.values()),
        "failures_by_kind": dict(sorted(failures.items())),
        "mean_turns": sum(row.get("metrics", {}).get("turns", 0) for row in rows) / len(rows) if rows else 0.0,
        "tokens": {"prompt": prompt_tokens, "model": model_tokens, "env": completion_tokens - model_tokens},
        "parse_errors": total("parse_errors"),
        "unparsed_tool_calls": total("unparsed_tool_calls"),
    }


def record_id(row: Mapping[str, Any]) -> str:
    """How the table names one record: `env task T repeat R` (the fields to find it by in the JSONL)."""
    return f"{row.get('env')} task_index={row.get('task_index')} repeat_index={row.get('repeat_index')}"


def failure_reasons(rows: Iterable[Mapping[str, Any]], *, top: int = TOP_REASONS) -> list[dict[str, Any]]:
    """The most frequent failure reasons: `{kind, reason, count, example}`, most frequent first.

    Reasons that differ only in an elapsed time (`failed in 12.3 s`) count as one."""
    counts: Counter[tuple[str, str]] = Counter()
    examples: dict[tuple[str, str], str] = {}
    for row in rows:
        if row.get("failure_kind"):
            key = (str(row["failure_kind"]), _ELAPSED.sub("# s", str(row.get("failure_reason") or "(no reason given)")))
            counts[key] += 1
            examples.setdefault(key, record_id(row))
    return [{"kind": kind, "reason": reason, "count": count, "example": examples[(kind, reason)]}
            for (kind, reason), count in counts.most_common(top)]


def _timeouts(rows: Iterable[Mapping[str, Any]], pattern: re.Pattern[str]) -> dict[str, int]:
    found: Counter[str] = Counter()
    for row in rows:
        match = pattern.search(str(row.get("failure_reason") or "")) if row.get("failure_kind") else None
        if match:
            found[match.group(1)] += 1
    return dict(found)


def request_timeouts(rows: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Rollouts whose model request timed out, by the timeout (`"120"` -> count)."""
    return _timeouts(rows, _REQUEST_TIMEOUT)


def summarize(records: Iterable[Any], *, wall_s: float | None = None, pass_threshold: float = 1.0,
              this_run: Iterable[Any] | None = None, num_repeats: int | None = None) -> dict[str, Any]:
    """Overall and per-environment metrics of records (RolloutRecords or their dicts).

    pass@k is given for k = 1 and k = `num_repeats` (default: the most rollouts of any task).
    Throughput counts `this_run` (default: all records) over `wall_s`: after a resume, only what
    this run generated."""
    rows = _rows(records)
    repeats = num_repeats or repeats_per_task(rows)
    summary = _block(rows, pass_threshold=pass_threshold, num_repeats=repeats)
    summary["failure_reasons"] = failure_reasons(rows)
    summary["request_timeouts"] = request_timeouts(rows)
    summary["deadline_timeouts"] = _timeouts(rows, _DEADLINE)
    by_env: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        by_env[str(row.get("env"))].append(row)
    summary["per_env"] = {env: _block(env_rows, pass_threshold=pass_threshold, num_repeats=repeats) for env, env_rows in sorted(by_env.items())}
    if wall_s is not None and wall_s > 0:
        ran = rows if this_run is None else _rows(this_run)
        model_tokens = _block(ran, pass_threshold=pass_threshold, num_repeats=repeats)["tokens"]["model"] if ran else 0
        summary["wall_s"] = round(wall_s, 3)
        summary["throughput"] = {
            "rollouts": len(ran),
            "model_tokens": model_tokens,
            "rollouts_per_s": len(ran) / wall_s,
            "model_tokens_per_s": model_tokens / wall_s,
        }
    return summary


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _failure_lines(summary: Mapping[str, Any]) -> list[str]:
    lines = ["failures: " + ", ".join(f"{kind}={count}" for kind, count in summary["failures_by_kind"].items())]
    for entry in summary.get("failure_reasons", []):
        reason = entry["reason"] if len(entry["reason"]) <= 300 else entry["reason"][:300] + "..."
        lines.append(f"  {entry['count']} x {entry['kind']}: {reason} (e.g. {entry['example']})")
    for timeout_s, count in summary.get("request_timeouts", {}).items():
        lines.append(f"{count} requests timed out after {timeout_s} s; raise --request-timeout-s "
                     "(a timed-out request is not retried: the server was still generating, and a retry starts over)")
    for deadline_s, count in summary.get("deadline_timeouts", {}).items():
        lines.append(f"{count} rollouts ran past their deadline of {deadline_s} s; raise --deadline-s (against a slow "
                     "server also --request-timeout-s), or ask for less: --limit, --max-new-tokens")
    return lines


def _replica_lines(stats: Mapping[str, Any]) -> list[str]:
    """One line per model replica (where a run routed over 2 or more) and the episode-affinity hit rate."""
    replicas = stats.get("replicas") or []
    if len(replicas) < 2:
        return []
    lines = [f"replica {entry['url']}: {entry['episodes']} episodes, {entry['calls']} calls, {entry['errors']} errors, "
             f"peak {entry['peak_in_flight']} in flight" for entry in replicas]
    rate = stats.get("affinity_hit_rate")
    if rate is not None:
        lines.append(f"episode affinity: {rate:.1%} of later calls found their episode's replica "
                     f"({stats.get('affinity_misses', 0)} moved)")
    return lines


def format_table(summary: Mapping[str, Any]) -> str:
    """A plain-text table: one line per environment, a total line, then failures with their most frequent reasons."""
    pass_keys = sorted((key for key in summary if key.startswith("pass@")), key=lambda key: int(key[5:]))
    header = ["env", "rollouts", "mean_reward", *pass_keys, "failed", "turns", "model_tok", "env_tok"]
    lines = [header]

    def line(name: str, block: Mapping[str, Any]) -> list[str]:
        return [
            name, str(block["rollouts"]), _number(block["mean_reward"]),
            *(_number(block.get(key)) for key in pass_keys),
            str(block["failed"]), f"{block['mean_turns']:.2f}",
            str(block["tokens"]["model"]), str(block["tokens"]["env"]),
        ]

    for env, block in summary["per_env"].items():
        lines.append(line(env, block))
    lines.append(line("ALL", summary))
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    text = "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in lines)
    extras = []
    if summary["failures_by_kind"]:
        extras.extend(_failure_lines(summary))
    if summary.get("parse_errors") or summary.get("unparsed_tool_calls"):
        extras.append(f"tool-call syntax: {parse_error_counts(summary.get('parse_errors', 0), summary.get('unparsed_tool_calls', 0))} "
                      "(malformed calls are shown to the model as errors; for the others see --tool-parser)")
    if "throughput" in summary:
        throughput = summary["throughput"]
        resumed = throughput.get("rollouts", summary["rollouts"]) != summary["rollouts"]
        extras.append(
            f"wall {summary['wall_s']:.1f} s, {throughput['rollouts_per_s']:.2f} rollouts/s, "
            f"{throughput['model_tokens_per_s']:.1f} model tokens/s"
            + (f" (this run's {throughput['rollouts']} rollouts; the rest were kept from the earlier run)" if resumed else "")
        )
    extras += _replica_lines(summary.get("replicas") or {})
    health = format_health(summary.get("tool_call_health") or {}, alarms=summary.get("alarms") or ())
    extras += [health] if health else []
    if pass_keys:
        extras.append("pass@k: share of tasks with at least one of their first k rollouts at full reward "
                      "(mean_reward and pass@1 differ when rewards are partial)")
    return "\n".join([text, *extras])
