"""Orchestration cost of the rollout engine, with generation taken out.

A scripted policy answers instantly with canned token ids, but everything else is real: the
embedded model's tokenizer and chat template (prompt rendering, tool deltas, decoding), tool-call
parsing, argument validation, the bundled `weather` and `multi_step` environments' tools and
verifiers, and record building. This is what a trainer pays on top of generation.

- single-turn: 2,000 `weather` rollouts whose one model turn answers without a tool call;
- five-call:   2,000 `multi_step` rollouts of six model turns: five tool calls
               (four `get_synonym_value`, one `extract_synonym_values`), then an answer;
- us_per_tool_call: (five-call time per rollout - single-turn time per rollout) / 5.

Every prompt is distinct (each row's user message carries its own number), as in real data, so
nothing comes from the engine's prompt cache; the `cached_` figures reuse the 8 example prompts of
each environment for all rollouts, for comparison. CPU time per rollout (`cpu_us_per_*`) is shown
too: where other processes load the machine, it moves less than the rates.

The process is pinned to one CPU core. Run: `.venv/bin/python benchmarks/engine_overhead.py`.
The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from gym_bridge import Engine, EngineConfig, Generation, Limits, ScriptedPolicy, get_environment, load_tasks, parse_task  # noqa: E402
from gym_bridge.core.template import ChatTemplate  # noqa: E402
from gym_bridge.policies.embedded import load_embedded_tokenizer  # noqa: E402


def scripted(tokenizer, texts: list[str]) -> list[Generation]:
    turns = []
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        turns.append(Generation(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop"))
    return turns


def replicate(tasks, count):
    """`count` tasks cycling through `tasks`, each with its own index but the same prompt as every
    `len(tasks)`-th other one (what the cached figures measure)."""
    from dataclasses import replace

    return [replace(tasks[i % len(tasks)], index=i) for i in range(count)]


def distinct(path, count):
    """`count` tasks from the rows of `path`, each user message numbered: no two prompts alike, as in real data."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    tasks = []
    for i in range(count):
        row = json.loads(json.dumps(rows[i % len(rows)]))
        messages = row["responses_create_params"]["input"]
        last_user = max(position for position, message in enumerate(messages) if message["role"] == "user")
        messages[last_user]["content"] += f" (case {i})"
        tasks.append(parse_task(row, index=i, source=f"{path.name}:{i + 1}"))
    return tasks


async def timed_run(engine: Engine, tasks) -> tuple[float, list]:
    started = time.perf_counter()
    records = [record async for record in engine.stream(tasks)]
    return time.perf_counter() - started, records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--all-cores", action="store_true", help="do not pin to one core")
    args = parser.parse_args()
    if not args.all_cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})

    tokenizer = load_embedded_tokenizer()
    template = ChatTemplate(tokenizer)
    config = EngineConfig(max_concurrency=args.concurrency, limits=Limits(max_turns=8, max_completion_tokens=4096))

    weather = load_tasks(get_environment("weather").example_data)
    single_script = scripted(tokenizer, ["It is cold there, so wear a coat."])
    multi_step = load_tasks(get_environment("multi_step").example_data)
    calls = [
        f'<tool_call>\n{{"name": "get_synonym_value", "arguments": {{"synonym": "{word}"}}}}\n</tool_call>'
        for word in ("Warm", "Hot", "Blazing", "Toasty")
    ]
    calls.append('<tool_call>\n{"name": "extract_synonym_values", "arguments": {"synonym_values": [407, 299, 711, 631]}}\n</tool_call>')
    multi_script = scripted(tokenizer, [*calls, "I submitted the values."])

    def engine(script):
        return Engine(ScriptedPolicy({"": script}, record_calls=False), template, config)

    weather_path, multi_path = get_environment("weather").example_data, get_environment("multi_step").example_data
    asyncio.run(timed_run(engine(single_script), distinct(weather_path, 200)))  # warm code paths (not prompts: all differ)
    asyncio.run(timed_run(engine(multi_script), distinct(multi_path, 200)))

    results = {}
    for label, make in (("", distinct), ("cached_", None)):
        single_tasks = distinct(weather_path, args.rollouts) if make else replicate(weather, args.rollouts)
        multi_tasks = distinct(multi_path, args.rollouts) if make else replicate(multi_step, args.rollouts)
        single_s, single_cpu, single_records = timed(engine(single_script), single_tasks)
        multi_s, multi_cpu, multi_records = timed(engine(multi_script), multi_tasks)
        failures = [r.failure_reason for r in single_records + multi_records if r.failed]
        if failures:
            raise SystemExit(f"{len(failures)} rollouts failed, first: {failures[0]}")
        assert all(r.tool_calls == 5 and r.turns == 6 for r in multi_records), "five-call rollouts did not make five calls"
        if make:
            prompts = {tuple(r.tokens.prompt_ids) for r in single_records}
            assert len(prompts) == len(single_records), "distinct rows rendered the same prompt"
        print(f"{label or 'distinct_'}single-turn: {len(single_records)} rollouts in {single_s:.3f} s (cpu {single_cpu:.3f} s)")
        print(f"{label or 'distinct_'}five-call:   {len(multi_records)} rollouts in {multi_s:.3f} s (cpu {multi_cpu:.3f} s)")
        results.update({
            f"{label}single_turn_rollouts_per_s": round(len(single_records) / single_s, 1),
            f"{label}multi_turn_rollouts_per_s": round(len(multi_records) / multi_s, 1),
            f"{label}us_per_tool_call": round((multi_s / len(multi_records) - single_s / len(single_records)) / 5 * 1e6, 1),
            f"{label}cpu_us_per_single_turn_rollout": round(single_cpu / len(single_records) * 1e6, 1),
            f"{label}cpu_us_per_five_call_rollout": round(multi_cpu / len(multi_records) * 1e6, 1),
        })
    results["rollouts"] = args.rollouts
    results["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(results))


def timed(engine: Engine, tasks) -> tuple[float, float, list]:
    """Wall seconds, this process's CPU seconds and the records of one run."""
    cpu = time.process_time()
    wall, records = asyncio.run(timed_run(engine, tasks))
    return wall, time.process_time() - cpu, records


if __name__ == "__main__":
    main()
