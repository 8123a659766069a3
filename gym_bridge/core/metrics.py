"""Summary metrics of a set of rollout records: what `gym-bridge eval` prints and saves.

Mean reward counts every rollout that was not masked; pass@k uses the unbiased estimator
over each task's repeats (a repeat passes when its reward is at least `pass_threshold`);
failures are counted by kind; token counts separate model and environment tokens; `parse_errors`
and `unparsed_tool_calls` total the tool calls the parser could not read.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any, Iterable, Mapping

from gym_bridge.core.health import format_health


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn from n (c of them correct) is correct."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def _rows(records: Iterable[Any]) -> list[Mapping[str, Any]]:
    return [record if isinstance(record, Mapping) else record.to_dict() for record in records]


def _block(rows: list[Mapping[str, Any]], *, pass_threshold: float) -> dict[str, Any]:
    scored = [row for row in rows if not row.get("mask_sample")]
    failures = Counter(row["failure_kind"] for row in rows if row.get("failure_kind"))
    by_task: dict[Any, list[bool]] = defaultdict(list)
    for row in scored:
        by_task[(row.get("env"), row.get("task_index"))].append(row["reward"] >= pass_threshold)
    repeats = min((len(v) for v in by_task.values()), default=0)
    pass_k: dict[str, float] = {}
    for k in sorted({1, repeats}):
        if k >= 1:
            values = [pass_at_k(len(v), sum(v), k) for v in by_task.values() if len(v) >= k]
            pass_k[f"pass@{k}"] = sum(values) / len(values) if values else 0.0
    model_tokens = sum(sum(row["tokens"]["completion_mask"]) for row in rows if "tokens" in row)
    completion_tokens = sum(len(row["tokens"]["completion_ids"]) for row in rows if "tokens" in row)
    prompt_tokens = sum(len(row["tokens"]["prompt_ids"]) for row in rows if "tokens" in row)
    def total(name: str) -> int:
        return sum(int(row.get("metrics", {}).get(name, 0) or 0) for row in rows)

    return {
        "rollouts": len(rows),
        "scored": len(scored),
        "mean_reward": sum(row["reward"] for row in scored) / len(scored) if scored else 0.0,
        **pass_k,
        "failed": sum(failures.values()),
        "failures_by_kind": dict(sorted(failures.items())),
        "mean_turns": sum(row.get("metrics", {}).get("turns", 0) for row in rows) / len(rows) if rows else 0.0,
        "tokens": {"prompt": prompt_tokens, "model": model_tokens, "env": completion_tokens - model_tokens},
        "parse_errors": total("parse_errors"),
        "unparsed_tool_calls": total("unparsed_tool_calls"),
    }


def summarize(records: Iterable[Any], *, wall_s: float | None = None, pass_threshold: float = 1.0,
              this_run: Iterable[Any] | None = None) -> dict[str, Any]:
    """Overall and per-environment metrics of records (RolloutRecords or their dicts).

    Throughput counts `this_run` (default: all records) over `wall_s`: after a resume, only what
    this run generated."""
    rows = _rows(records)
    summary = _block(rows, pass_threshold=pass_threshold)
    by_env: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        by_env[str(row.get("env"))].append(row)
    summary["per_env"] = {env: _block(env_rows, pass_threshold=pass_threshold) for env, env_rows in sorted(by_env.items())}
    if wall_s is not None and wall_s > 0:
        ran = rows if this_run is None else _rows(this_run)
        model_tokens = _block(ran, pass_threshold=pass_threshold)["tokens"]["model"] if ran else 0
        summary["wall_s"] = round(wall_s, 3)
        summary["throughput"] = {
            "rollouts": len(ran),
            "model_tokens": model_tokens,
            "rollouts_per_s": len(ran) / wall_s,
            "model_tokens_per_s": model_tokens / wall_s,
        }
    return summary


def format_table(summary: Mapping[str, Any]) -> str:
    """A plain-text table: one line per environment and a total line."""
    pass_keys = sorted(key for key in summary if key.startswith("pass@"))
    header = ["env", "rollouts", "mean_reward", *pass_keys, "failed", "turns", "model_tok", "env_tok"]
    lines = [header]

    def line(name: str, block: Mapping[str, Any]) -> list[str]:
        return [
            name, str(block["rollouts"]), f"{block['mean_reward']:.3f}",
            *(f"{block.get(key, 0.0):.3f}" for key in pass_keys),
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
        extras.append("failures: " + ", ".join(f"{kind}={count}" for kind, count in summary["failures_by_kind"].items()))
    if summary.get("parse_errors") or summary.get("unparsed_tool_calls"):
        extras.append(f"tool-call syntax: {summary.get('parse_errors', 0)} calls could not be parsed, "
                      f"{summary.get('unparsed_tool_calls', 0)} turns held an unparsed tool call (see --tool-parser)")
    if "throughput" in summary:
        throughput = summary["throughput"]
        resumed = throughput.get("rollouts", summary["rollouts"]) != summary["rollouts"]
        extras.append(
            f"wall {summary['wall_s']:.1f} s, {throughput['rollouts_per_s']:.2f} rollouts/s, "
            f"{throughput['model_tokens_per_s']:.1f} model tokens/s"
            + (f" (this run's {throughput['rollouts']} rollouts; the rest were kept from the earlier run)" if resumed else "")
        )
    health = format_health(summary.get("tool_call_health") or {}, alarms=summary.get("alarms") or ())
    extras += [health] if health else []
    if pass_keys:
        extras.append("pass@k: share of tasks with at least one of their first k rollouts at full reward "
                      "(mean_reward and pass@1 differ when rewards are partial)")
    return "\n".join([text, *extras])
