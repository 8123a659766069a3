"""The engine against hostile environment code (issue 9): exits and interrupts raised by a
verifier or tool (item 3), huge tool outputs (item 4), tools that kill their process (item 5)."""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import sys
import time

import pytest

from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.environment import Environment, VerifyResult, tool
from gym_bridge.core.policy import ScriptedPolicy
from gym_bridge.core.registry import register
from gym_bridge.core.task import parse_task
from tests.support.invariants import assert_token_invariants

CALL = '<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


def call(name, **args):
    return CALL.format(name=name, args=json.dumps(args))


def run(engine, tasks):
    async def collect():
        return sorted([record async for record in engine.stream(tasks)], key=lambda record: record.task_index)

    return asyncio.run(collect())


def tasks_for(env_name, modes):
    return [parse_task({"prompt": "Go.", "environment": env_name, "mode": mode}, index=i) for i, mode in enumerate(modes)]


def _raise(mode):
    if mode == "exit":
        sys.exit(3)
    if mode == "interrupt":
        raise KeyboardInterrupt("pressed inside")
    if mode == "cancel":
        raise asyncio.CancelledError()


@register
class Quitter(Environment):
    name = "quitter_for_hardening_test"

    @tool
    def act(self, how: str) -> str:
        """Act.

        Args:
            how: How.
        """
        _raise(how)
        return "acted"

    def verify(self, task, output):
        _raise(task.get("mode"))
        return 1.0


@register
class AsyncQuitter(Quitter):
    name = "async_quitter_for_hardening_test"

    async def verify(self, task, output):
        _raise(task.get("mode"))
        return 1.0


@register
class InlineQuitter(Quitter):
    name = "inline_quitter_for_hardening_test"
    inline_sync_tools = True


@pytest.mark.parametrize("env_class", [Quitter, AsyncQuitter])
def test_a_verifier_that_exits_or_interrupts_fails_only_its_rollout(smol_template, turn, env_class):
    """Item 3: SystemExit, KeyboardInterrupt and CancelledError from verify become `verifier`
    records naming what was raised; the healthy sibling is scored."""
    engine = Engine(ScriptedPolicy({"": [turn("done")]}), smol_template, EngineConfig())
    records = run(engine, tasks_for(env_class.name, ["exit", "interrupt", "cancel", "fine"]))
    assert [(r.failure_kind, r.failure_reason) for r in records[:3]] == [
        ("verifier", "verify raised SystemExit: 3"),
        ("verifier", "verify raised KeyboardInterrupt: pressed inside"),
        ("verifier", "verify raised CancelledError"),
    ]
    assert (records[3].failure_kind, records[3].reward) == (None, 1.0)


@pytest.mark.parametrize("env_class", [Quitter, InlineQuitter])
def test_a_tool_that_exits_or_interrupts_fails_only_its_rollout(smol_template, turn, env_class):
    """Item 3: the same for tools, in a worker thread and inline on the event loop."""
    script = {f"{i}-0": [turn(call("act", how=how)), turn("done")] for i, how in enumerate(["exit", "interrupt", "cancel", "fine"])}
    engine = Engine(ScriptedPolicy(script), smol_template, EngineConfig())
    records = run(engine, tasks_for(env_class.name, ["fine"] * 4))
    assert [(r.failure_kind, r.failure_reason) for r in records[:3]] == [
        ("env", "tool 'act' raised SystemExit: 3"),
        ("env", "tool 'act' raised KeyboardInterrupt: pressed inside"),
        ("env", "tool 'act' raised CancelledError"),
    ]
    assert (records[3].failure_kind, records[3].reward) == (None, 1.0)


@register
class Firehose(Environment):
    name = "firehose_for_hardening_test"

    @tool
    def dump(self, chars: int) -> str:
        """Return a long text.

        Args:
            chars: How many characters.
        """
        words = "lorem ipsum dolor sit amet "
        return (words * (chars // len(words) + 1))[:chars]

    def verify(self, task, output):
        return VerifyResult(reward=1.0)


def test_a_huge_tool_output_is_truncated_with_a_note(smol_template, turn):
    """Item 4: a 50 MB tool output reaches the model as its first `max_tool_output_chars`
    characters and a note; the record holds what the model read."""
    script = {"": [turn(call("dump", chars=50_000_000)), turn("done")]}
    engine = Engine(ScriptedPolicy(script), smol_template,
                    EngineConfig(limits=Limits(max_completion_tokens=100_000, max_tool_output_chars=20_000)))
    started = time.perf_counter()
    [record] = run(engine, tasks_for(Firehose.name, ["fine"]))
    assert time.perf_counter() - started < 10
    assert record.failure_kind is None and record.finish_reason == "answer"
    [output] = [item["output"] for item in record.output if item["type"] == "function_call_output"]
    assert output.startswith("lorem ipsum") and len(output) < 20_200
    assert output.endswith("[truncated by gym_bridge: the tool returned 50,000,000 characters; only the first 20,000 are shown]")
    assert_token_invariants(record.to_dict())


def test_tokenizing_a_long_tool_output_does_not_stall_other_rollouts(smol_template, turn):
    """Item 4: a 3-million-character output is tokenized off the event loop (the old code held
    the loop for the whole tokenization, seconds); a rollout whose tokenization outlives its
    deadline is recorded as `timeout` on time."""
    script = {"": [turn(call("dump", chars=3_000_000)), turn("done")]}
    limits = Limits(max_completion_tokens=2_000_000, max_tool_output_chars=3_000_000)

    async def scenario(deadline_s):
        engine = Engine(ScriptedPolicy(script), smol_template, EngineConfig(limits=limits, deadline_s=deadline_s))
        lags, stop = [], asyncio.Event()

        async def ticker():
            loop = asyncio.get_running_loop()
            while not stop.is_set():
                before = loop.time()
                await asyncio.sleep(0.005)
                lags.append(loop.time() - before - 0.005)

        ticking = asyncio.ensure_future(ticker())
        started = time.perf_counter()
        records = [record async for record in engine.stream(tasks_for(Firehose.name, ["fine"]))]
        elapsed = time.perf_counter() - started
        stop.set()
        await ticking
        return records, max(lags), elapsed

    [record], max_lag_s, _ = asyncio.run(scenario(deadline_s=60))
    assert record.failure_kind is None and record.finish_reason == "answer"
    assert len(record.tokens.completion_ids) > 500_000  # it really was tokenized
    assert max_lag_s < 0.5, f"the event loop stalled for {max_lag_s:.2f} s"

    [record], _, elapsed_s = asyncio.run(scenario(deadline_s=0.3))
    assert record.failure_kind == "timeout"
    assert elapsed_s < 1.5


@register
class Fragile(Environment):
    """Isolated: its session state must survive the trips to the worker process and back."""

    name = "fragile_for_hardening_test"
    isolate_tools = True
    tool_timeout_s = 20.0

    def setup(self, task):
        self.mode = task.get("mode")
        self.calls = 0
        self.pid = os.getpid()

    @tool
    def poke(self) -> dict:
        """Poke it."""
        self.calls += 1
        if self.mode == "exit":
            os._exit(7)
        if self.mode == "segfault":
            ctypes.string_at(0)
        return {"calls": self.calls}

    def verify(self, task, output):
        return VerifyResult(reward=float(self.calls == 1), metrics={"pid": self.pid, "verify_pid": os.getpid()})


@pytest.mark.timeout(120)
def test_isolated_tools_that_kill_their_process_fail_only_their_rollout(smol_template, turn):
    """Item 5: with `isolate_tools`, os._exit and a segfault in a tool take down a worker
    process, not the run: those rollouts are `env` failures, the sibling is scored with its
    session state carried between processes, and the run's own process is untouched."""
    script = {"": [turn(call("poke")), turn("done")]}
    engine = Engine(ScriptedPolicy(script), smol_template, EngineConfig())
    records = run(engine, tasks_for(Fragile.name, ["exit", "segfault", "fine"]))
    for record in records[:2]:
        assert record.failure_kind == "env"
        assert "tool 'poke' raised WorkerCrashed: the worker process running Fragile.poke died" in record.failure_reason
    fine = records[2]
    assert (fine.failure_kind, fine.reward) == (None, 1.0)
    [output] = [json.loads(item["output"]) for item in fine.output if item["type"] == "function_call_output"]
    assert output == {"calls": 1}  # the session's state went to the tool's worker and back (setup ran in a worker too)
    assert fine.verify_metrics["pid"] != os.getpid() and fine.verify_metrics["verify_pid"] != os.getpid()
