"""What every rollout pays in the engine, pinned where it once grew (issue 29: `benchmarks/engine_overhead.py` slower).

After the redesign a rollout whose policy is never parked still went through an async context manager per model call
and one for its deadline (an async generator each, registered with the event loop), and `_rollout` / `_attempt` held
lambdas only a journaled run uses, whose closure cells were allocated on every rollout. Both cost interpreter work and
extra garbage collections per rollout. Counted here, not timed: the counts do not depend on the machine's load.
"""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.policy import ScriptedPolicy
from gym_bridge.core.registry import get_environment
from gym_bridge.core.task import load_tasks

CALL = '<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


class Parked(ScriptedPolicy):
    parks_calls = True


def five_calls(turn):
    """The benchmark's five-call script for `multi_step`: four synonym lookups, one submission, an answer."""
    calls = [CALL.format(name="get_synonym_value", args=json.dumps({"synonym": word})) for word in ("Warm", "Hot", "Blazing", "Toasty")]
    calls.append(CALL.format(name="extract_synonym_values", args=json.dumps({"synonym_values": [407, 299, 711, 631]})))
    return [turn(text) for text in (*calls, "I submitted the values.")]


def async_generators_started(policy, template) -> tuple[list[str], int]:
    """The async generators first iterated during one `multi_step` rollout (by code name), and its tool calls."""
    task = load_tasks(get_environment("multi_step").example_data)[0]
    engine = Engine(policy, template, EngineConfig(template_check="off"))
    started: list[str] = []

    async def scenario():
        firstiter, finalizer = sys.get_asyncgen_hooks()  # the event loop's own: kept, only watched

        def watch(agen):
            started.append(agen.ag_code.co_name)
            if firstiter is not None:
                firstiter(agen)

        sys.set_asyncgen_hooks(firstiter=watch, finalizer=finalizer)
        try:
            return await engine.rollout(task)
        finally:
            sys.set_asyncgen_hooks(firstiter=firstiter, finalizer=finalizer)

    record = asyncio.run(scenario())
    assert record.failure_kind is None, record.failure_reason
    return started, record.tool_calls


def test_a_rollout_whose_calls_are_never_parked_starts_no_async_generator(smol_template, turn):
    started, tool_calls = async_generators_started(ScriptedPolicy({"": five_calls(turn)}, record_calls=False), smol_template)
    assert tool_calls == 5
    assert started == []


def test_a_parked_policys_calls_still_hold_the_deadline(smol_template, turn):
    # the counter sees the deadline's context managers where they are needed: the rollout's and each of its 6 model calls'
    started, _ = async_generators_started(Parked({"": five_calls(turn)}, record_calls=False), smol_template)
    assert len(started) == 1 + 6


@pytest.mark.parametrize("function", [Engine.rollout, Engine._attempt], ids=lambda f: f.__qualname__)
def test_the_engine_allocates_no_closure_cells_for_the_journal_on_every_rollout(function):
    # issue 29: lambdas only a journaled run uses made cells on every rollout, even where the lambda was not made (the
    # journal's attempt is a `partial` now); the loop is written plainly (a comprehension's cell per turn costs nothing
    # a benchmark sees: docs/benchmarks.md)
    assert function.__code__.co_cellvars == ()
