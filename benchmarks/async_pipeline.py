"""SIMULATION: synchronous vs asynchronous RL end to end on a simulated cluster, gym_bridge's worker against TRL's own.

    .venv/bin/python benchmarks/async_pipeline.py [--rows 128] [--repeats 3] [--modes sync,async,trl]

Nothing here is a GPU. The "model server" is a stub over HTTP on loopback (aiohttp) that takes `token_latency_s`
per generated token (an asyncio sleep, so concurrent requests overlap as on a batching GPU server), answers a
tool call until the episode has made its number of tool calls, then an answer, and honours `/pause?mode=keep`
and `/resume`. The "trainer" takes `batch` rows per optimizer step, sleeps `step_s` (its compute), then syncs:
pause (keep), `sync_s`, resume, version + 1. It drops a row older than `max_staleness` versions, as
AsyncGRPOTrainer does. Episodes have a long-tailed number of turns (Pareto, capped). Modes, run A/B interleaved:
- `sync`: generate a batch (gym_bridge's engine), train, sync, repeat (nothing overlaps);
- `async`: gym_bridge's AsyncRolloutWorker (staleness by admission) feeding the trainer while it steps, a row
  carrying its last model call's version, with its end-of-run rule (`row_budget` = `rows`: it starts no group beyond
  the rows the trainer will take); its defaults as `for_trainer` sets them. Not run by default: `async_oldest`, the
  same worker with `row_version="first_call"`, a row carrying its oldest token's version; `async_no_end`, the worker
  without the end-of-run rule (it runs on, and trains the rows that finish first);
- `trl`: TRL 1.16's own `_AsyncRolloutLoop` (in a thread of this process instead of its spawned child) on the
  same stub: it re-renders messages each turn, stamps a group's version at dispatch, caps work in flight at
  `max_inflight_tasks` (its default, max_staleness x batch).
Per mode: wall time per `rows` trained rows, the trainer's and the generator's idle shares, where the trainer's wait
went (for its first batch, and for all later ones together), rows discarded for staleness (and how many of them were
long episodes' rows), the largest staleness seen (by the row's version, and by its oldest token's), and how many long
episodes' rows (>= `long_turns`) made it into training; for gym_bridge's worker also how many it started, and of those
not trained, how many were done and waiting when the row budget ended the run and how many were still running.
Each repeat also measures the pipeline limit as issue 39 defines it: the larger of generating the run's episodes at full concurrency (every rollout at once, no trainer) and
training alone (the steps and syncs over rows already waiting), and reports each mode's wall time as a ratio to it.
The generation half is that of the first `rows` rows' groups in task order; a worker that trains groups admitted
later while the slowest episodes run can finish under it (`long_share_trained` then shows what it left in flight).

The bound for "train exactly the started set" (`trained_set_bound`, per repeat: `wall_lower_bound_s`,
`idle_lower_bound`, and each mode's `wall_to_bound`). Suppose a scheduler trains exactly the rows of the groups it
starts, and those are the first `rows` rows' groups (what gym_bridge's worker does with its end-of-run rule). The one
premise: a row cannot be done before its episode's generated tokens times `token_latency_s` after the run starts (the
stub sleeps that long per token, a call's tokens and an episode's calls in sequence; pauses and load only add). Sort
these earliest finish times r_1 <= ... <= r_n (n = `rows`, B = `batch`, S = n / B steps, b = `step_s` + `sync_s`).
Step j trains B rows that no earlier step trained, so when it starts at least jB rows are done: start_j >= r_jB; and
it starts after step j-1 and its sync: start_j >= start_(j-1) + b. Hence wall >= start*_S + b, with start*_1 = r_B and
start*_j = max(r_jB, start*_(j-1) + b). The trainer is busy S x b (its sleeps; its pause and resume calls add
milliseconds), so its idle share is at least 1 - S x b / (start*_S + b). No admission rule, staleness window or order
enters it, so every scheduler that trains exactly its started set is above it, one that knew every episode's length
in advance included. A second bound (`in_order_bound`: `wall_bound_in_order_s`, `idle_bound_in_order`) adds what
gym_bridge's worker does not know and must obey: it starts the groups in task order (each task runs once per run, so
no history says which are long) under the staleness window, where the g-th group (from 0) may start only once
(g + 1) x group <= (k + max_staleness + 1) x B for the k steps the trainer has finished; so its rows are done no
sooner than start*_k + b plus their token time, which feeds back into the step starts (iterated to a fixed point, each
round a lower bound). Not a premise: that the set cannot be generated faster than at full concurrency (the limit's
generation half). That is false here: the simulation is CPU-bound (the stub, the worker and the trainer share one
process on a shared machine), so an episode among 128 at once takes several times its token time, and a worker that
runs fewer at once generates the same set sooner than the limit's measurement does.
Medians over repeats with [min, max]. The JSON summary is the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import queue
import random
import re
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiohttp import web  # noqa: E402

from gym_bridge import Environment, VerifyResult, tool  # noqa: E402
from gym_bridge.core.registry import register  # noqa: E402

_TURNS = re.compile(r"exactly (\d+) times")


def wanted_calls(text: str) -> int:
    """The number of tool calls an episode's prompt asks for."""
    match = _TURNS.search(text)
    if match is None:
        raise ValueError(f"no 'exactly N times' in {text[:200]!r}")
    return int(match.group(1))


def step_starts(finish_s: list[float], *, batch: int, busy_s: float) -> list[float]:
    """The earliest start of each step (start*_j of the module docstring): `batch` rows of a step all done, the step
    before it and its sync (`busy_s`) over. Raises ValueError when the rows do not fill whole steps."""
    if not finish_s or len(finish_s) % batch:
        raise ValueError(f"{len(finish_s)} rows do not fill steps of {batch}")
    ready = sorted(finish_s)
    starts = [ready[batch - 1]]
    for step in range(2, len(ready) // batch + 1):
        starts.append(max(ready[step * batch - 1], starts[-1] + busy_s))
    return starts


def trained_set_bound(finish_s: list[float], *, batch: int, step_s: float, sync_s: float) -> dict[str, float]:
    """The least wall time and trainer idle share of a run that trains exactly the rows whose earliest finish times
    (seconds from the run's start) are `finish_s`, `batch` rows per step of `step_s` plus a `sync_s` sync (the
    derivation is in the module docstring). Raises ValueError when the rows do not fill whole steps."""
    busy_s = step_s + sync_s
    starts = step_starts(finish_s, batch=batch, busy_s=busy_s)
    wall_s = starts[-1] + busy_s
    return {"wall_lower_bound_s": round(wall_s, 3), "idle_lower_bound": round(1 - len(starts) * busy_s / wall_s, 3)}


def in_order_bound(durations_s: list[float], *, group: int, batch: int, step_s: float, sync_s: float,
                   max_staleness: int) -> dict[str, float]:
    """`trained_set_bound` for a worker that also starts the groups in the order given (`durations_s`: each row's
    least episode time, a group's `group` rows together) under the staleness window: the g-th group (from 0) starts
    only once its rows and all before it fit, (g + 1) x group <= (k + max_staleness + 1) x batch, i.e. once the
    trainer has finished k steps and their syncs. Start times and step starts bound each other; iterated from the
    unconstrained bound they only rise, and each round is still a lower bound (the module docstring)."""
    busy_s = step_s + sync_s
    finish_s = list(durations_s)
    while True:
        versions_s = [0.0] + [start + busy_s for start in step_starts(finish_s, batch=batch, busy_s=busy_s)]
        earliest = [versions_s[max(0, -(-(index // group + 1) * group // batch) - max_staleness - 1)] + duration
                    for index, duration in enumerate(durations_s)]
        if earliest == finish_s:
            break
        finish_s = earliest
    bound = trained_set_bound(finish_s, batch=batch, step_s=step_s, sync_s=sync_s)
    return {"wall_bound_in_order_s": bound["wall_lower_bound_s"], "idle_bound_in_order": bound["idle_lower_bound"]}


def token_times_s(server: "StubServer", args: argparse.Namespace) -> list[float]:
    """The bound's premise: each trained row's earliest finish, its episode's generated tokens at `token_latency_s` each."""
    turns = [int(row["turns"]) for row in make_rows(args)]
    groups = [turns[i % len(turns)] for i in range(args.rows // args.group)]
    return [(k * len(server.call) + len(server.answer)) * args.token_latency_s for k in groups for _ in range(args.group)]


@register
class StepsEnvironment(Environment):
    """An episode of K tool calls: the row says K; reward 1 for exactly K calls."""

    name = "bench_steps"
    inline_sync_tools = True

    @tool
    def step(self) -> str:
        """Take one step.
        """
        return "ok"

    def verify(self, task: Any, output: Any) -> VerifyResult:
        calls = sum(item["type"] == "function_call" for item in output)
        return VerifyResult(reward=float(calls == int(task["turns"])))


def step_tool() -> str:
    """Take one step.
    """
    return "ok"


class StubServer:
    """The simulated model server (see the module docstring); counts its busy and idle time."""

    def __init__(self, tokenizer: Any, token_latency_s: float) -> None:
        self.tokenizer = tokenizer
        self.token_latency_s = token_latency_s
        self.eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.call = tokenizer.encode('<tool_call>\n{"name": "step", "arguments": {}}\n</tool_call>', add_special_tokens=False) + [self.eos]
        self.answer = tokenizer.encode("All steps are done.", add_special_tokens=False) + [self.eos]
        self.active = 0
        self.idle_s = 0.0
        self._idle_since: float | None = time.perf_counter()
        self.paused = False
        self._resumed: asyncio.Event | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.url = ""

    def reset_clock(self) -> None:
        self.idle_s, self._idle_since = 0.0, (time.perf_counter() if self.active == 0 else None)

    def idle_total(self) -> float:
        return self.idle_s + (time.perf_counter() - self._idle_since if self._idle_since is not None else 0.0)

    async def completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        prompt = list(body["prompt"])
        text = self.tokenizer.decode(prompt)
        wanted = wanted_calls(text)
        done = text.count("<tool_response>") + text.count("<|im_start|>tool")
        ids = self.call if done < wanted else self.answer
        if self.active == 0 and self._idle_since is not None:
            self.idle_s += time.perf_counter() - self._idle_since
            self._idle_since = None
        self.active += 1
        try:
            for _ in ids:
                await asyncio.sleep(self.token_latency_s)
                while self.paused:
                    assert self._resumed is not None
                    await self._resumed.wait()
        finally:
            self.active -= 1
            if self.active == 0:
                self._idle_since = time.perf_counter()
        choice = {"index": 0, "text": self.tokenizer.decode(ids), "token_ids": ids, "prompt_token_ids": prompt, "finish_reason": "stop",
                  "logprobs": {"token_logprobs": [-0.5] * len(ids), "tokens": [f"token_id:{i}" for i in ids]}}
        return web.json_response({"id": "c", "object": "text_completion", "model": "stub", "choices": [choice]})

    async def pause(self, request: web.Request) -> web.Response:
        assert self._resumed is not None
        self.paused = True
        self._resumed.clear()
        return web.json_response({})

    async def resume(self, request: web.Request) -> web.Response:
        assert self._resumed is not None
        self.paused = False
        self._resumed.set()
        return web.json_response({})

    def start(self) -> None:
        ready = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self.loop = loop
            asyncio.set_event_loop(loop)
            self._resumed = asyncio.Event()
            app = web.Application()
            app.router.add_post("/v1/completions", self.completions)
            app.router.add_post("/pause", self.pause)
            app.router.add_post("/resume", self.resume)
            runner = web.AppRunner(app, access_log=None)
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", 0)
            loop.run_until_complete(site.start())
            self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            ready.set()
            loop.run_forever()

        threading.Thread(target=serve, daemon=True).start()
        ready.wait()


class Trainer:
    """The simulated trainer: `batch` rows per step, `step_s` of compute, a pause/resume sync, TRL's stale-row drop."""

    def __init__(self, server: StubServer, args: argparse.Namespace, on_version: Any) -> None:
        import httpx

        self.server, self.args, self.on_version = server, args, on_version
        self.http = httpx.Client(timeout=60)
        self.version = 1
        self.wait_s = 0.0
        self.discarded = 0
        self.staleness: list[int] = []
        self.oldest_staleness: list[int] = []
        """Per trained row: the trainer's version minus the version of the row's oldest token."""
        self.trained_turns: list[int] = []
        self.complete: list[bool] = []
        """Per trained row: did its episode make exactly its number of tool calls (the stub obeys, so it should)."""
        self.discarded_turns: list[int] = []
        """Per row dropped for staleness: its episode's tool calls."""
        self.step_waits_s: list[float] = []
        """Per optimizer step: how long the trainer waited for its batch's rows."""

    def sync(self) -> None:
        self.http.post(self.server.url + "/pause", params={"mode": "keep"})
        time.sleep(self.args.sync_s)
        self.http.post(self.server.url + "/resume")
        self.version += 1
        self.on_version(self.version)

    def take(self, rows: "queue.Queue[Any]", turns_of: Any, complete: Any, oldest_version: Any = None) -> None:
        """Train until `args.rows` rows went into steps; `oldest_version(sample)` is the version of a row's oldest
        token (None: the row's own version)."""
        batch: list[Any] = []
        waited_s = 0.0
        while len(self.trained_turns) < self.args.rows:
            started = time.perf_counter()
            sample = rows.get()
            waited_s += time.perf_counter() - started
            staleness = 0 if sample is None else self.version - int(sample.model_version)
            if staleness > self.args.max_staleness:
                self.discarded += 1
                self.discarded_turns.append(turns_of(sample))
                continue
            self.staleness.append(staleness)
            self.oldest_staleness.append(staleness if oldest_version is None else self.version - int(oldest_version(sample)))
            batch.append(sample)
            if len(batch) == self.args.batch:
                self.wait_s += waited_s
                self.step_waits_s.append(round(waited_s, 3))
                waited_s = 0.0
                self.trained_turns += [turns_of(sample) for sample in batch]
                self.complete += [complete(sample) for sample in batch]
                batch = []
                time.sleep(self.args.step_s)
                self.sync()


def make_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    rng = random.Random(args.seed)
    turns = [min(int(rng.paretovariate(args.pareto_alpha)), args.max_turns) for _ in range(args.tasks)]
    return [{"prompt": f"Call the step tool exactly {k} times, then say that all steps are done.", "environment": StepsEnvironment.name,
             "turns": k} for k in turns]


def run_sync(server: StubServer, tokenizer: Any, args: argparse.Namespace) -> dict[str, Any]:
    from gym_bridge.core.agent_loop import Limits
    from gym_bridge.core.engine import Engine, EngineConfig
    from gym_bridge.core.policy import SamplingParams
    from gym_bridge.core.task import parse_task
    from gym_bridge.core.template.chat_template import ChatTemplate
    from gym_bridge.policies.remote import RemotePolicy

    tasks = [parse_task(row, index=i) for i, row in enumerate(make_rows(args))]
    trainer = Trainer(server, args, lambda version: None)
    policy = RemotePolicy(server.url + "/v1", model="stub")
    engine = Engine(policy, ChatTemplate(tokenizer),
                    EngineConfig(sampling=SamplingParams(max_new_tokens=64), limits=Limits(max_turns=args.max_turns + 1, max_completion_tokens=4096)))
    loop = asyncio.new_event_loop()
    groups_per_step = args.batch // args.group
    started = time.perf_counter()
    server.reset_clock()
    position = 0
    while len(trainer.trained_turns) < args.rows:
        batch = [tasks[(position + i) % len(tasks)] for i in range(groups_per_step)]
        position += groups_per_step
        generated = time.perf_counter()
        groups = loop.run_until_complete(engine.run_groups(batch, group_size=args.group))
        trainer.wait_s += time.perf_counter() - generated
        trainer.step_waits_s.append(round(time.perf_counter() - generated, 3))
        trainer.trained_turns += [int(record.task["turns"]) for group in groups for record in group if not record.failed]
        trainer.complete += [record.reward == 1.0 for group in groups for record in group if not record.failed]
        trainer.staleness += [0] * sum(len(group) for group in groups)
        trainer.oldest_staleness += [0] * sum(len(group) for group in groups)
        time.sleep(args.step_s)
        trainer.sync()
    loop.run_until_complete(policy.aclose())
    loop.close()
    return summary(trainer, server, time.perf_counter() - started, args)


def run_async(server: StubServer, tokenizer: Any, args: argparse.Namespace, row_version: Any = "last_call",
              end_of_run: bool = True) -> dict[str, Any]:
    from gym_bridge.trl import AsyncRolloutWorker, AsyncWorkerSettings
    from gym_bridge.core.agent_loop import Limits
    from gym_bridge.core.policy import SamplingParams
    from gym_bridge.core.task import parse_task
    from gym_bridge.core.template.chat_template import ChatTemplate
    from gym_bridge.policies.remote import RemotePolicy

    tasks = [parse_task(row, index=i) for i, row in enumerate(make_rows(args))]
    settings = AsyncWorkerSettings(group_size=args.group, max_staleness=args.max_staleness, rows_per_version=args.batch,
                                   sampling=SamplingParams(max_new_tokens=64),
                                   limits=Limits(max_turns=args.max_turns + 1, max_completion_tokens=4096), row_version=row_version,
                                   row_budget=args.rows if end_of_run else None)
    worker = AsyncRolloutWorker(tasks, RemotePolicy(server.url + "/v1", model="stub"), ChatTemplate(tokenizer), settings)
    by_prompt = {tuple(task.messages[0]["content"].split()): int(task["turns"]) for task in tasks}
    trainer = Trainer(server, args, worker.update_model_version)
    worker.update_model_version(1)
    started = time.perf_counter()
    server.reset_clock()
    worker.start()
    turns_of = lambda sample: by_prompt[tuple(sample.prompt[-1]["content"].split())]  # noqa: E731
    try:
        trainer.take(worker.rollout_buffer, turns_of, lambda sample: sample.metrics["reward"] == 1.0,
                     lambda sample: sample.model_version - sample.metrics.get("gym_bridge/row_version_span", 0.0))
        in_flight = [int(tasks[group_id % len(tasks)]["turns"]) for group_id in list(worker.admission.admitted)] * args.group
    finally:
        worker.stop()
    wall_s = time.perf_counter() - started
    waiting = []
    while not worker.rollout_buffer.empty():
        waiting.append(turns_of(worker.rollout_buffer.get_nowait()))
    result = summary(trainer, server, wall_s, args)
    # a row budget ends the run: what was started and not trained is either done and waiting or still running
    result["long_rows_waiting_at_end"] = sum(turns >= args.long_turns for turns in waiting)
    result["long_rows_in_flight_at_end"] = sum(turns >= args.long_turns for turns in in_flight)
    result["long_rows_started"] = result["long_episodes_trained"] + result["long_rows_waiting_at_end"] + result["long_rows_in_flight_at_end"]
    return result


def run_trl(server: StubServer, tokenizer: Any, args: argparse.Namespace) -> dict[str, Any]:
    from datasets import Dataset
    from trl.chat_template_utils import qwen3_template
    from trl.experimental.async_grpo.async_rollout_worker import _AsyncRolloutLoop

    class Value:
        def __init__(self, value: float) -> None:
            self.value = value

    importlib.import_module("accelerate.state").PartialState()  # TRL's loop logs through accelerate, as its spawned child sets up
    tokenizer = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    tokenizer.response_template = qwen3_template  # SmolLM2 writes Hermes-style <tool_call> blocks, as Qwen3 does
    rows = make_rows(args)
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": row["prompt"]}], "turns": row["turns"]} for row in rows])
    version = Value(1)
    buffer: queue.Queue[Any] = queue.Queue()
    # in-process stand-ins for the mp.Value / mp.Event / mp.Queue objects its spawned child is handed
    shared: dict[str, Any] = {"rollout_buffer": buffer, "model_version_value": version, "heartbeat_value": Value(0.0),
                              "failed_event": threading.Event(), "exception_info_queue": queue.Queue(), "metrics_queue": queue.Queue()}
    loop = _AsyncRolloutLoop(
        model_name="stub", dataset=dataset, reward_funcs=[lambda completions, **kwargs: [1.0] * len(completions)],
        processing_class=tokenizer, eos_token_ids=[tokenizer.convert_tokens_to_ids("<|im_end|>")], tools=[step_tool],
        num_generations=args.group, max_inflight_tasks=args.max_staleness * args.batch, vllm_server_url=server.url,
        max_tokens=64, max_tool_calling_iterations=args.max_turns + 1, **shared,
    )
    trainer = Trainer(server, args, lambda v: setattr(version, "value", v))
    thread = threading.Thread(target=loop.run, daemon=True)
    started = time.perf_counter()
    server.reset_clock()
    thread.start()
    try:
        trainer.take(buffer, lambda sample: wanted_calls(sample.prompt[-1]["content"]),
                     lambda sample: sum(bool(m.get("tool_calls")) for m in sample.completion) == wanted_calls(sample.prompt[-1]["content"]))
    finally:
        loop._loop.call_soon_threadsafe(loop._stop_event.set)
        thread.join(timeout=30)
    return summary(trainer, server, time.perf_counter() - started, args)


def measure_limit(server: StubServer, tokenizer: Any, args: argparse.Namespace) -> dict[str, float]:
    """The pipeline limit of this setting, both halves measured now: the episodes of `rows` trained rows generated at
    full concurrency (every rollout at once, the trainer idle), and training alone (the steps and their syncs over
    rows already waiting). A pipeline that overlaps them perfectly takes the larger."""
    from gym_bridge.core.agent_loop import Limits
    from gym_bridge.core.engine import Engine, EngineConfig
    from gym_bridge.core.policy import SamplingParams
    from gym_bridge.core.task import parse_task
    from gym_bridge.core.template.chat_template import ChatTemplate
    from gym_bridge.policies.remote import RemotePolicy

    tasks = [parse_task(row, index=i) for i, row in enumerate(make_rows(args))]
    groups = -(-args.rows // args.group)
    policy = RemotePolicy(server.url + "/v1", model="stub")
    engine = Engine(policy, ChatTemplate(tokenizer),
                    EngineConfig(sampling=SamplingParams(max_new_tokens=64), max_concurrency=groups * args.group,
                                 limits=Limits(max_turns=args.max_turns + 1, max_completion_tokens=4096)))
    loop = asyncio.new_event_loop()
    started = time.perf_counter()
    loop.run_until_complete(engine.run_groups([tasks[i % len(tasks)] for i in range(groups)], group_size=args.group))
    generation_s = time.perf_counter() - started
    loop.run_until_complete(policy.aclose())
    loop.close()
    trainer = Trainer(server, args, lambda version: None)
    waiting: queue.Queue[Any] = queue.Queue()
    for _ in range(args.rows):
        waiting.put(None)  # a row as fresh as the trainer when it takes it
    started = time.perf_counter()
    trainer.take(waiting, lambda sample: 0, lambda sample: True, lambda sample: trainer.version)
    training_s = time.perf_counter() - started
    return {"generation_full_concurrency_s": round(generation_s, 3), "training_alone_s": round(training_s, 3),
            "limit_s": round(max(generation_s, training_s), 3)}


def summary(trainer: Trainer, server: StubServer, wall_s: float, args: argparse.Namespace) -> dict[str, Any]:
    trained = trainer.trained_turns[: args.rows]
    return {
        "wall_s": round(wall_s, 3),
        "trainer_idle_share": round(trainer.wait_s / wall_s, 3),
        "generator_idle_share": round(server.idle_total() / wall_s, 3),
        "discarded_stale": trainer.discarded,
        "max_staleness_seen": max(trainer.staleness, default=0),
        "max_oldest_token_staleness": max(trainer.oldest_staleness, default=0),
        "long_episodes_trained": sum(turns >= args.long_turns for turns in trained),
        "long_rows_dropped_stale": sum(turns >= args.long_turns for turns in trainer.discarded_turns),
        "first_step_wait_s": trainer.step_waits_s[0] if trainer.step_waits_s else 0.0,
        "later_steps_wait_s": round(sum(trainer.step_waits_s[1:]), 3),
        "long_share_trained": round(sum(turns >= args.long_turns for turns in trained) / max(len(trained), 1), 3),
        "mean_tool_calls_trained": round(statistics.mean(trained), 3),
        "complete_episode_share": round(sum(trainer.complete[: args.rows]) / max(len(trained), 1), 3),
    }


def spread(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Median, min and max of each figure over the repeats."""
    return {key: {"median": statistics.median(run[key] for run in runs), "min": min(run[key] for run in runs),
                  "max": max(run[key] for run in runs)} for key in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=128, help="trained rows per run")
    parser.add_argument("--batch", type=int, default=16, help="rows per optimizer step")
    parser.add_argument("--group", type=int, default=4, help="rollouts per task")
    parser.add_argument("--max-staleness", type=int, default=1)  # a longer-tailed setting: --pareto-alpha 0.8 --max-turns 32 --max-staleness 2
    parser.add_argument("--step-s", type=float, default=0.4, help="simulated optimizer step")
    parser.add_argument("--sync-s", type=float, default=0.05, help="simulated weight sync while the server is paused")
    parser.add_argument("--token-latency-s", type=float, default=0.002, help="simulated time per generated token")
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--max-turns", type=int, default=16, help="cap of the long-tailed tool-call count")
    parser.add_argument("--pareto-alpha", type=float, default=1.1)
    parser.add_argument("--long-turns", type=int, default=6, help="an episode with at least this many tool calls is long")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default="sync,async,trl")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from gym_bridge.policies.embedded import load_embedded_tokenizer

    tokenizer = load_embedded_tokenizer()
    server = StubServer(tokenizer, args.token_latency_s)
    server.start()
    runners = {"sync": run_sync, "async": run_async, "trl": run_trl,
               "async_oldest": lambda s, t, a: run_async(s, t, a, row_version="first_call"),
               "async_no_end": lambda s, t, a: run_async(s, t, a, end_of_run=False)}
    modes = args.modes.split(",")
    results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    limits: list[dict[str, float]] = []
    for repeat in range(args.repeats):
        limit: dict[str, float] = measure_limit(server, tokenizer, args)
        token_s = token_times_s(server, args)
        limit.update(trained_set_bound(token_s, batch=args.batch, step_s=args.step_s, sync_s=args.sync_s))
        limit.update(in_order_bound(token_s, group=args.group, batch=args.batch, step_s=args.step_s, sync_s=args.sync_s,
                                    max_staleness=args.max_staleness))
        limits.append(limit)
        print(f"repeat {repeat} limit: {limit}", flush=True)
        for mode in modes if repeat % 2 == 0 else reversed(modes):  # A/B interleaved, order alternating
            result = runners[mode](server, tokenizer, args)
            result["wall_to_limit"] = round(result["wall_s"] / limit["limit_s"], 3)
            result["wall_to_bound"] = round(result["wall_s"] / limit["wall_lower_bound_s"], 3)
            result["wall_to_bound_in_order"] = round(result["wall_s"] / limit["wall_bound_in_order_s"], 3)
            results[mode].append(result)
            print(f"repeat {repeat} {mode}: {result}", flush=True)
    rows = make_rows(args)
    long_share = sum(row["turns"] >= args.long_turns for row in rows) / len(rows)
    report: dict[str, Any] = {"simulation": True, "what": "SIMULATION: a stub model server and a sleeping trainer, no GPU", "settings": {k: v for k, v in vars(args).items()},
                              "long_episode_share_of_tasks": round(long_share, 3), "modes": {}}
    for mode, runs in results.items():
        report["modes"][mode] = spread(runs)
    report["limit"] = spread(limits)
    print_table(report)
    print(json.dumps(report))


def print_table(report: dict[str, Any]) -> None:
    """Each mode's medians beside the limit and the bound for training exactly the started set."""
    limit = report["limit"]
    print(f"limit {limit['limit_s']['median']} s; training exactly the started set: bound {limit['wall_lower_bound_s']['median']} s "
          f"(idle >= {limit['idle_lower_bound']['median']:.1%}), starting groups in task order under the window "
          f"{limit['wall_bound_in_order_s']['median']} s (idle >= {limit['idle_bound_in_order']['median']:.1%})")
    print("| mode | wall s | wall / limit | wall / bound | wall / bound in order | trainer idle | dropped stale | long rows trained |")
    for mode, figures in report["modes"].items():
        median = {key: value["median"] for key, value in figures.items()}
        print(f"| {mode} | {median['wall_s']} | {median['wall_to_limit']} | {median['wall_to_bound']} | {median['wall_to_bound_in_order']} "
              f"| {median['trainer_idle_share']:.0%} | {median['discarded_stale']} | {median['long_episodes_trained']} |")


if __name__ == "__main__":
    main()
