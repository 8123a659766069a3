"""Orchestration cost of the rollout engine, with generation taken out.

A scripted policy answers instantly with canned token ids, but everything else is real: the
embedded model's tokenizer and chat template (prompt rendering, tool deltas, decoding), tool-call
parsing, argument validation, the bundled `weather` and `multi_step` environments' tools and
verifiers, and record building. This is what a trainer pays on top of generation.

- single-turn: `weather` rollouts whose one model turn answers without a tool call;
- five-call:   `multi_step` rollouts of six model turns: five tool calls
               (four `get_synonym_value`, one `extract_synonym_values`), then an answer;
- us_per_tool_call: (five-call time per rollout - single-turn time per rollout) / 5.

Headline keys (`single_turn_rollouts_per_s`, `multi_turn_rollouts_per_s`, ...): every rollout has
its own prompt, as in real data (the row's user message gets a request number never used before
in the process), so each first prompt is rendered and tokenized afresh; as in real data, the rows
of one environment share their system prompt and tool listing, whose ids the template keeps (see
`ChatTemplate.encode`). The scripted tool calls, and so the tool results, are the same in every
rollout, and the template keeps the ids of those pieces too: the five-call figures and
`us_per_tool_call` are a lower bound on what distinct tool outputs cost. `cached_*` keys: the old setup, the example files' 8 rows
reused for every rollout, where the template's per-prompt cache answers almost every first prompt.
`cpu_us_per_*` is the process's CPU time (process_time) per rollout: unlike the wall
clock it barely moves when other processes load the machine.

After loading, the objects alive are frozen out of garbage collection, as `gym-bridge eval` does
(`freeze_startup_objects`); `--no-gc-freeze` measures the collector as it is inside a trainer's
process, where the records of a run also stay alive. The process is pinned to one CPU core. Run: `.venv/bin/python benchmarks/engine_overhead.py`
(about a minute). The last line printed is JSON.

`--journal-ab N`: only the five-call case, N runs with the resume journal off and N with it on (each rollout commits
its turns to a journal on disk, fsynced, as `gym-bridge eval --journal` does), interleaved off/on so both see the
same machine load; prints the medians, their min-max and the median slowdown of the runs paired in time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from gym_bridge import Engine, EngineConfig, Generation, Limits, ScriptedPolicy, get_environment, load_tasks  # noqa: E402
from gym_bridge.core.engine import freeze_startup_objects  # noqa: E402
from gym_bridge.core.journal import RolloutKey, RunFingerprint, open_journal  # noqa: E402
from gym_bridge.core.template.chat_template import ChatTemplate  # noqa: E402
from gym_bridge.policies.embedded import load_embedded_tokenizer  # noqa: E402


def scripted(tokenizer, texts: list[str]) -> list[Generation]:
    turns = []
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        turns.append(Generation(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop"))
    return turns


def replicate(tasks, count):
    """`count` tasks cycling through `tasks`, each with its own index but the same prompts (cache hits)."""
    return [replace(tasks[i % len(tasks)], index=i) for i in range(count)]


def distinct(tasks, count, start: int = 0):
    """`count` tasks cycling through `tasks`, each with its own prompt: the user message ends in a
    request number (`start`, `start + 1`, ...; the benchmark never reuses one)."""
    out = []
    for i in range(count):
        task = tasks[i % len(tasks)]
        *head, last = task.messages
        out.append(replace(task, index=i, messages=(*head, {**last, "content": f"{last['content']} (request {start + i})"})))
    return out


async def _stream(engine: Engine, tasks) -> list:
    if engine.journal is None:
        return [record async for record in engine.stream(tasks)]
    records = []
    async for record in engine.stream(tasks):  # as `gym-bridge eval`: the record is kept, then its journal dropped
        records.append(record)
        engine.journal.finish(RolloutKey.of_task(record.task_index, record.repeat_index))
    await engine.journal.close()
    return records


def timed_run(engine: Engine, tasks) -> tuple[float, float, list]:
    """Wall seconds, CPU seconds and the records of one engine run over `tasks`."""
    wall, cpu = time.perf_counter(), time.process_time()
    records = asyncio.run(_stream(engine, tasks))
    return time.perf_counter() - wall, time.process_time() - cpu, records


class Bench:
    """The template, the scripts and the tasks of both cases."""

    def __init__(self, concurrency: int = 256) -> None:
        self.tokenizer = load_embedded_tokenizer()
        self.template = ChatTemplate(self.tokenizer)
        self.config = EngineConfig(max_concurrency=concurrency, limits=Limits(max_turns=8, max_completion_tokens=4096))
        self.weather = load_tasks(get_environment("weather").example_data)
        self.multi_step = load_tasks(get_environment("multi_step").example_data)
        self.single_script = scripted(self.tokenizer, ["It is cold there, so wear a coat."])
        calls = [
            f'<tool_call>\n{{"name": "get_synonym_value", "arguments": {{"synonym": "{word}"}}}}\n</tool_call>'
            for word in ("Warm", "Hot", "Blazing", "Toasty")
        ]
        calls.append('<tool_call>\n{"name": "extract_synonym_values", "arguments": {"synonym_values": [407, 299, 711, 631]}}\n</tool_call>')
        self.multi_script = scripted(self.tokenizer, [*calls, "I submitted the values."])
        self.requests = 0

    def engine(self, script) -> Engine:
        return Engine(ScriptedPolicy({"": script}, record_calls=False), self.template, self.config)

    def run(self, case: str, count: int, *, prompts: str = "distinct", journal_dir: Path | None = None) -> tuple[float, float, list]:
        """One timed run of `count` rollouts of `case` ("single" or "multi") with distinct or cached prompts; with
        `journal_dir`, the rollouts journal their turns there (the journal is prepared inside the timed run)."""
        tasks, script = (self.weather, self.single_script) if case == "single" else (self.multi_step, self.multi_script)
        if prompts == "distinct":
            rows = distinct(tasks, count, self.requests)
            self.requests += count
        else:
            rows = replicate(tasks, count)
        engine = self.engine(script)
        if journal_dir is None:
            return timed_run(engine, rows)
        wall, cpu = time.perf_counter(), time.process_time()
        engine = engine.with_journal(open_journal(journal_dir, RunFingerprint.of_engine(self.config, rows), mode="fresh"))
        _, _, records = timed_run(engine, rows)
        return time.perf_counter() - wall, time.process_time() - cpu, records


def check(records, case: str) -> None:
    failures = [r.failure_reason for r in records if r.failed]
    if failures:
        raise SystemExit(f"{len(failures)} rollouts failed, first: {failures[0]}")
    if case == "multi":
        assert all(r.tool_calls == 5 and r.turns == 6 for r in records), "five-call rollouts did not make five calls"


def journal_ab(bench: Bench, *, runs: int, rollouts: int) -> dict[str, object]:
    """The five-call case with the journal off and on, interleaved (off, on, off, on, ...); wall seconds per run."""
    off: list[float] = []
    on: list[float] = []
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory(prefix="journal-ab-", dir=os.environ.get("JOURNAL_AB_DIR")) as temp:
        for position in range(runs):
            bench.template._prompt_cache.clear()
            wall_s, cpu_s, records = bench.run("multi", rollouts)
            check(records, "multi")
            off.append(wall_s)
            cpu["off"].append(cpu_s)
            bench.template._prompt_cache.clear()
            wall_s, cpu_s, records = bench.run("multi", rollouts, journal_dir=Path(temp) / f"run{position}")
            cpu["on"].append(cpu_s)
            check(records, "multi")
            if (Path(temp) / f"run{position}").exists():
                raise SystemExit("the journal of a finished run was not removed")
            on.append(wall_s)
    paired = sorted(b / a - 1 for a, b in zip(off, on))
    return {
        "journal_off_rollouts_per_s": round(rollouts / statistics.median(off), 1),
        "journal_off_rollouts_per_s_min_max": [round(rollouts / max(off), 1), round(rollouts / min(off), 1)],
        "journal_on_rollouts_per_s": round(rollouts / statistics.median(on), 1),
        "journal_on_rollouts_per_s_min_max": [round(rollouts / max(on), 1), round(rollouts / min(on), 1)],
        "journal_slowdown_median_pct": round(100 * statistics.median(paired), 1),
        "journal_slowdown_min_max_pct": [round(100 * paired[0], 1), round(100 * paired[-1], 1)],
        "journal_cpu_us_per_rollout_off_on": [round(statistics.median(cpu["off"]) / rollouts * 1e6, 1),
                                               round(statistics.median(cpu["on"]) / rollouts * 1e6, 1)],
        "journal_cpu_overhead_median_pct": round(100 * (statistics.median(cpu["on"]) / statistics.median(cpu["off"]) - 1), 1),
        "journal_commits_per_rollout": 5,
        "runs_per_arm": runs,
        "rollouts": rollouts,
        "journal_dir_filesystem": _filesystem(os.environ.get("JOURNAL_AB_DIR") or tempfile.gettempdir()),
    }


def _filesystem(path: str) -> str:
    """The filesystem type holding `path` (from /proc/mounts; '' where unknown)."""
    try:
        mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return ""
    best = max((m for m in mounts if os.path.realpath(path).startswith(m[1])), key=lambda m: len(m[1]), default=None)
    return f"{best[2]} on {best[1]}" if best else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3, help="runs per case; the median is reported")
    parser.add_argument("--all-cores", action="store_true", help="do not pin to one core")
    parser.add_argument("--no-gc-freeze", action="store_true",
                        help="leave the garbage collector as it is (as inside a trainer) instead of freezing the "
                             "objects alive after loading, as `gym-bridge eval` does")
    parser.add_argument("--journal-ab", type=int, default=0, metavar="N",
                        help="only the five-call case: N runs with the resume journal off and N on, interleaved")
    args = parser.parse_args()
    if not args.all_cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})

    bench = Bench(args.concurrency)
    for case in ("single", "multi"):  # warm code paths and the template's delta plans (distinct prompts: no cache help)
        bench.run(case, 200, prompts="distinct")
    if not args.no_gc_freeze:
        freeze_startup_objects()
    if args.journal_ab:
        result_ab = journal_ab(bench, runs=args.journal_ab, rollouts=args.rollouts)
        result_ab["gc_freeze"] = not args.no_gc_freeze
        result_ab["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
        print(json.dumps(result_ab))
        return

    result: dict[str, float] = {}
    per_rollout: dict[str, float] = {}
    for prompts, prefix in (("distinct", ""), ("cached", "cached_")):
        for case, name in (("single", "single_turn"), ("multi", "multi_turn")):
            runs = []
            for _ in range(args.repeats):
                bench.template._prompt_cache.clear()  # every run starts cold; `cached` fills it within the run
                wall_s, cpu_s, records = bench.run(case, args.rollouts, prompts=prompts)
                check(records, case)
                runs.append((wall_s, cpu_s))
            walls = sorted(wall for wall, _ in runs)
            wall_s = walls[len(walls) // 2]
            cpu_s = sorted(cpu for _, cpu in runs)[len(runs) // 2]
            per_rollout[prefix + case] = wall_s / args.rollouts
            result[f"{prefix}{name}_rollouts_per_s"] = round(args.rollouts / wall_s, 1)
            result[f"{prefix}{name}_rollouts_per_s_min_max"] = [round(args.rollouts / walls[-1], 1), round(args.rollouts / walls[0], 1)]
            cpu_name = "single_turn" if case == "single" else "five_call"
            result[f"{prefix}cpu_us_per_{cpu_name}_rollout"] = round(cpu_s / args.rollouts * 1e6, 1)
            print(f"{prefix or 'distinct '}{name}: {args.rollouts} rollouts, median {wall_s:.3f} s wall, {cpu_s:.3f} s cpu")
        result[f"{prefix}us_per_tool_call"] = round((per_rollout[prefix + "multi"] - per_rollout[prefix + "single"]) / 5 * 1e6, 1)
    result["rollouts"] = args.rollouts
    result["repeats"] = args.repeats
    result["gc_freeze"] = not args.no_gc_freeze
    result["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
