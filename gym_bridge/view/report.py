"""`gym-bridge view`: one self-contained HTML report of a rollout file (or two, compared).

The page is `report_template.html` with the data inlined as JSON: no request leaves it (its
Content-Security-Policy forbids any), so it works offline and can be mailed around. It holds a
per-environment summary (reward histogram, pass@k, failures by kind with their most frequent
reasons, tokens, turns, tool calls, latency percentiles, tool-call health), a table of every
selected rollout (filtered, sorted and paginated in the page, 100 rows a page), and, for at most
`max_detail` rollouts (a seeded uniform sample beyond that), the conversation and the token view
(model, environment and prompt tokens, each token's log-prob on hover). Two files add a
per-task table of mean-reward differences (tasks matched by their input row).
"""

from __future__ import annotations

import html
import json
import random
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any

from gym_bridge.core.health import tool_call_health
from gym_bridge.core.metrics import summarize
from gym_bridge.core.rollout_file import input_row
from gym_bridge.core.task import task_key
from gym_bridge.view.decode import Decoder, decoder_for
from gym_bridge.core.errors import DataError
from gym_bridge.view.reading import SORT_KEYS, Skipped, iter_rollouts, policy_versions, require_some, token_runs, record_turns

HISTOGRAM_BINS = 10
ROW_COLUMNS = ("id", "run", "env", "task", "repeat", "reward", "failure", "reason", "turns", "tool_calls",
               "model_tokens", "env_tokens", "latency_s", "finish", "detail")
"""Columns of the report's rollout table (`data.rows` holds one list per rollout in this order)."""


@dataclass(frozen=True)
class Report:
    output: Path
    rollouts: int
    detailed: int
    files: tuple[str, ...]
    skipped: int = 0
    """Lines left out as unreadable (each reported by the caller)."""

    def describe(self) -> str:
        sampled = "" if self.detailed == self.rollouts else " (a seeded sample: the rest are in the table only)"
        return (f"wrote {self.output}: {self.rollouts} rollouts from {', '.join(self.files)}; "
                f"conversation and tokens embedded for {self.detailed}{sampled}"
                + (f"; {self.skipped} unreadable lines skipped" if self.skipped else ""))


def percentiles(values: Sequence[float], points: Sequence[int] = (50, 90, 99)) -> dict[str, float]:
    """Nearest-rank percentiles (`p50`, ...) of `values`; zeros when empty."""
    ordered = sorted(values)
    if not ordered:
        return {f"p{point}": 0.0 for point in points}
    return {f"p{point}": float(ordered[min(len(ordered) - 1, max(0, -(-point * len(ordered) // 100) - 1))]) for point in points}


def histogram(rewards: Sequence[float], *, bins: int = HISTOGRAM_BINS) -> dict[str, Any]:
    """Counts of rewards in `bins` equal bins over [min(0, lowest), max(1, highest)]."""
    low, high = min([0.0, *rewards]), max([1.0, *rewards])
    counts = [0] * bins
    for reward in rewards:
        counts[min(bins - 1, int((reward - low) / (high - low) * bins))] += 1
    return {"low": low, "high": high, "counts": counts}


def env_stats(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per environment: what `summarize` gives plus the histogram, top failure reasons, turn, tool-call and latency spreads."""
    summary = summarize(rows)
    health = tool_call_health(rows)["per_env"]
    by_env: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        by_env[str(row.get("env"))].append(row)
    stats = {}
    for env, env_rows in sorted(by_env.items()):
        metrics = [row.get("metrics") or {} for row in env_rows]
        reasons = Counter(f"{row['failure_kind']}: {row.get('failure_reason')}" for row in env_rows if row.get("failure_kind"))
        stats[env] = {
            **summary["per_env"][env],
            "histogram": histogram([float(row.get("reward") or 0.0) for row in env_rows if not row.get("mask_sample")]),
            "top_reasons": reasons.most_common(5),
            "turns": percentiles([float(m.get("turns") or 0) for m in metrics]),
            "tool_calls": percentiles([float(m.get("tool_calls") or 0) for m in metrics]),
            "latency_s": percentiles([float(m.get("latency_s") or 0) for m in metrics]),
            "health": health.get(env, {}),
        }
    return stats


def _table_row(position: int, run: int, record: Mapping[str, Any], detailed: bool) -> list[Any]:
    metrics = record.get("metrics") or {}
    tokens = record.get("tokens") or {}
    model_tokens = sum(tokens.get("completion_mask") or [])
    return [position, run, str(record.get("env")), record.get("task_index"), record.get("repeat_index"),
            round(float(record.get("reward") or 0.0), 6), record.get("failure_kind") or "", str(record.get("failure_reason") or "")[:200],
            metrics.get("turns", 0), metrics.get("tool_calls", 0), model_tokens, len(tokens.get("completion_ids") or []) - model_tokens,
            round(float(metrics.get("latency_s") or 0.0), 4), metrics.get("finish_reason", ""), int(detailed)]


def _detail(record: Mapping[str, Any], vocabulary: dict[int, str], decoder: Decoder) -> dict[str, Any]:
    tokens = record.get("tokens") or {}
    prompt_ids = list(tokens.get("prompt_ids") or [])
    runs = token_runs(record)
    for token in prompt_ids + [token for run in runs for token in run.ids]:
        if token not in vocabulary:
            vocabulary[token] = decoder.piece(token)
    return {
        "model": (record.get("response") or {}).get("model") or "",
        "reward_components": record.get("reward_components") or {},
        "failure_reason": record.get("failure_reason"),
        "mask_sample": bool(record.get("mask_sample")),
        "metrics": record.get("metrics") or {},
        "versions": versions.summary() if (versions := policy_versions(record)).known else "",
        "turns": [[turn.role, turn.text, turn.name, turn.call_id] for turn in record_turns(record)],
        "prompt": prompt_ids,
        "runs": [[run.kind, list(run.ids), [round(value, 4) for value in run.logprobs]] for run in runs],
    }


def compared_task(record: Mapping[str, Any]) -> str:
    """Which task a record is a rollout of, across runs: its environment and the `task_key` of its input row
    (without a trainer's `step`). Computed when the records are read, never stored: nothing reads an older one."""
    row = {key: value for key, value in input_row(dict(record)).items() if key != "step"}  # trainer records carry their step
    return f"{record.get('env')}:{task_key(row)}"


def _task_means(records: Sequence[Mapping[str, Any]]) -> dict[str, tuple[float | None, int, Mapping[str, Any]]]:
    """Per task key: mean reward of the unmasked rollouts (None without one), their count, the first record.
    `records` are light copies (`_light`), which carry the key of the whole record they were made from."""
    rewards: dict[str, list[float]] = defaultdict(list)
    first: dict[str, Mapping[str, Any]] = {}
    for record in records:
        key = str(record["task_key"])
        first.setdefault(key, record)
        if not record.get("mask_sample"):
            rewards[key].append(float(record.get("reward") or 0.0))
    return {key: (sum(rewards[key]) / len(rewards[key]) if rewards[key] else None, len(rewards[key]), first[key]) for key in first}


def compare(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per task present in either run: mean reward (unmasked rollouts) in A and B and B - A, largest change first.
    `a` and `b` are the runs' light records (`_light`)."""
    in_a, in_b = _task_means(a), _task_means(b)
    rows: list[dict[str, Any]] = []
    for key in dict.fromkeys([*in_a, *in_b]):
        mean_a, n_a, source = in_a[key] if key in in_a else (None, 0, in_b[key][2])
        mean_b, n_b, _ = in_b.get(key, (None, 0, source))
        prompt = next((turn.text for turn in record_turns(source) if turn.role == "user"), "")
        diff = None if mean_a is None or mean_b is None else mean_b - mean_a
        rows.append({"env": str(source.get("env")), "task": source.get("task_index"), "prompt": prompt[:160],
                     "a": mean_a, "b": mean_b, "n_a": n_a, "n_b": n_b, "diff": diff})
    rows.sort(key=lambda row: -abs(row["diff"]) if row["diff"] is not None else 0.0)
    return rows


def _light(record: Mapping[str, Any]) -> dict[str, Any]:
    """What the summary and the comparison need of a record: no trajectory, token counts instead of token lists,
    and its task key (taken from the whole record: the fields added here are not part of the task)."""
    tokens = record.get("tokens") or {}
    model_tokens = sum(tokens.get("completion_mask") or [])
    light = {key: value for key, value in record.items() if key not in ("response", "tokens")}
    light["response"] = {"model": (record.get("response") or {}).get("model"), "output": []}
    light["token_counts"] = {"prompt": len(tokens.get("prompt_ids") or []), "model": model_tokens,
                             "env": len(tokens.get("completion_ids") or []) - model_tokens}
    light["task_key"] = compared_task(record)
    return light


def _run_stats(light: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    stats = env_stats(light)
    for env, block in stats.items():
        counts = [row["token_counts"] for row in light if str(row.get("env")) == env]
        block["tokens"] = {kind: sum(count[kind] for count in counts) for kind in ("prompt", "model", "env")}
    return stats


def build_data(paths: Sequence[str], *, envs: Sequence[str] = (), failed: bool = False, sort: str = "file",
               tokenizer: str | None = None, max_detail: int = 2000, seed: int = 0,
               skipped: list[Skipped] | None = None) -> dict[str, Any]:
    """The JSON the page renders (see the module docstring). Records stream through once: each leaves a table
    row and a light copy for the summary; a seeded reservoir keeps `max_detail` whole records for their
    conversation and tokens. Raises DataError for unreadable input or an `envs` name no record has; with a
    `skipped` list, unreadable lines go there instead (see `iter_rollouts`)."""
    if sort not in SORT_KEYS:
        raise DataError(f"--sort must be one of {', '.join(SORT_KEYS)}, got {sort!r}")
    rng = random.Random(seed)
    rows: list[list[Any]] = []
    lights: list[list[dict[str, Any]]] = []
    kept: list[tuple[int, int, dict[str, Any]]] = []
    present: set[str] = set()
    read = 0
    for run, path in enumerate(paths):
        lights.append([])
        for position, record in enumerate(iter_rollouts(path, skipped=skipped)):
            read += 1
            present.add(str(record.get("env")))
            if (envs and str(record.get("env")) not in envs) or (failed and not record.get("failure_kind")):
                continue
            seen = len(rows)
            rows.append(_table_row(position, run, record, False))
            lights[run].append(_light(record))
            if seen < max_detail:
                kept.append((run, position, record))
            elif (slot := rng.randint(0, seen)) < max_detail:
                kept[slot] = (run, position, record)
    require_some(skipped or [], read)
    missing = [env for env in envs if env not in present]
    if missing:
        raise DataError(f"no rollouts of environment(s) {', '.join(missing)}; the files have {', '.join(sorted(present)) or 'none'}")
    decoder = decoder_for([record for _, _, record in kept[:50]], tokenizer=tokenizer)
    vocabulary: dict[int, str] = {}
    details = {f"{run}:{position}": _detail(record, vocabulary, decoder) for run, position, record in kept}
    for row in rows:
        row[-1] = int(f"{row[1]}:{row[0]}" in details)
    return {
        "files": [Path(path).name for path in paths],
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "decoder": decoder.source,
        "columns": ROW_COLUMNS,
        "rows": rows,
        "details": details,
        "vocabulary": {str(token): piece for token, piece in vocabulary.items()},
        "stats": [_run_stats(light) for light in lights],
        "sampling": {"rollouts": len(rows), "detailed": len(details), "seed": seed, "page_size": 100},
        "compare": compare(lights[0], lights[1]) if len(paths) == 2 else None,
        "initial_sort": sort,
    }


def render(data: Mapping[str, Any]) -> str:
    """The report page: the template with `data` inlined (every `<` escaped, so no text can close the script)."""
    template = resources.files("gym_bridge.view").joinpath("report_template.html").read_text(encoding="utf-8")
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    title = html.escape(" vs ".join(data["files"]))
    return template.replace("__TITLE__", title).replace("__DATA__", payload)


def write_report(paths: Sequence[str], *, output: str | Path, envs: Sequence[str] = (), failed: bool = False, sort: str = "file",
                 tokenizer: str | None = None, max_detail: int = 2000, seed: int = 0, skipped: list[Skipped] | None = None) -> Report:
    """Write the report for one rollout file (or two, compared) to `output`, atomically; nothing is written if input is bad
    (with a `skipped` list, unreadable lines are left out and listed there, see `build_data`)."""
    before = len(skipped or [])
    data = build_data(paths, envs=envs, failed=failed, sort=sort, tokenizer=tokenizer, max_detail=max_detail, seed=seed, skipped=skipped)
    page = render(data)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    temp = output.with_name(output.name + ".tmp")
    temp.write_text(page, encoding="utf-8")
    temp.replace(output)
    return Report(output=output, rollouts=len(data["rows"]), detailed=len(data["details"]), files=tuple(str(path) for path in paths),
                  skipped=len(skipped or []) - before)
