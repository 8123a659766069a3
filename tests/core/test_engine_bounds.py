"""Bounded everything (issue 19, items 11 and 12): the rollout deadline covers verify, and a tool that
returns millions of values is encoded only as far as the model reads it, off the event loop."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.session import encode_capped
from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.environment import Environment, VerifyResult, tool
from gym_bridge.core.policy import SamplingParams, ScriptedPolicy
from gym_bridge.core.task import parse_task


class SlowVerifier(Environment):
    name = "slow_verifier_for_bounds_test"
    verify_timeout_s = 600.0

    async def verify(self, task, output):
        await asyncio.sleep(60)
        return VerifyResult(reward=1.0)


class SlowSyncVerifier(SlowVerifier):
    name = "slow_sync_verifier_for_bounds_test"

    def verify(self, task, output):  # type: ignore[override]
        time.sleep(60)
        return VerifyResult(reward=1.0)


def rollout(engine: Engine, env_class: type[Environment], *, guard_s: float = 30.0):
    task = parse_task({"prompt": "Go.", "environment": env_class.name}, index=0)

    async def bounded():
        return await asyncio.wait_for(engine.rollout(task, env_class=env_class), timeout=guard_s)

    return asyncio.run(bounded())


@pytest.mark.parametrize("env_class", [SlowVerifier, SlowSyncVerifier])
def test_the_rollout_deadline_covers_verify(env_class, smol_template, turn) -> None:
    """Item 11: a verify that takes a minute (its own timeout: 600 s) ends at the rollout's 1 s deadline
    as a `timeout` failure; it used to run outside the deadline, bounded only by its own timeout."""
    engine = Engine(ScriptedPolicy({"": [turn("Done.")]}), smol_template, EngineConfig(deadline_s=1.0))
    started = time.monotonic()
    record = rollout(engine, env_class)
    assert (record.failure_kind, record.mask_sample) == ("timeout", True) and "deadline of 1 s" in record.failure_reason
    assert time.monotonic() - started < 10


MANY = [7] * 5_000_000
"""Five million ints: `json.dumps` of it takes about a second and holds the GIL all along."""


class Firehose(Environment):
    name = "firehose_for_bounds_test"

    @tool
    def dump(self) -> list:
        """Dump everything."""
        return MANY

    def verify(self, task, output):
        return VerifyResult(reward=1.0)


def test_a_tool_returning_millions_of_values_is_encoded_only_as_far_as_the_cap_off_the_loop(smol_template, turn) -> None:
    """Item 12: the tool's 5 million ints used to be serialized whole on the event loop (about a second
    with every other rollout stalled) before the output cap cut them; now only the first
    `max_tool_output_chars` are encoded, in a worker thread, while the loop keeps ticking."""
    policy = ScriptedPolicy({"": [turn('<tool_call>\n{"name": "dump", "arguments": {}}\n</tool_call>'), turn("Done.")]})
    config = EngineConfig(sampling=SamplingParams(max_new_tokens=32), limits=Limits(max_tool_output_chars=1000, max_completion_tokens=4096))
    engine = Engine(policy, smol_template, config)
    task = parse_task({"prompt": "Go.", "environment": Firehose.name}, index=0)

    async def rollout_while_ticking():
        ticks: list[float] = []

        async def tick():
            while True:
                ticks.append(time.monotonic())
                await asyncio.sleep(0.005)

        ticker = asyncio.create_task(tick())
        await asyncio.sleep(0.05)
        try:
            record = await engine.rollout(task, env_class=Firehose)
            await asyncio.sleep(0.05)      # the ticker records the last gap
            return record, ticks
        finally:
            ticker.cancel()

    record, ticks = asyncio.run(rollout_while_ticking())
    assert record.failure_kind is None, record.failure_reason
    assert max(b - a for a, b in zip(ticks, ticks[1:])) < 0.5        # json.dumps(MANY) alone holds the loop ~1 s
    output = next(item["output"] for item in record.output if item["type"] == "function_call_output")
    assert output.startswith("[7, 7, 7") and output.endswith("the tool returned more than 1,000 characters; only the first 1,000 are shown]")
    assert len(output.split("\n")[0]) == 1000


@pytest.mark.parametrize("value", [{"a": [1, 2.5, None, True, "é\n"], "b": {"c": []}}, list(range(3000)), [float("nan")], "text"])
def test_capped_encoding_is_json_dumps(value) -> None:
    """Under the cap the text is exactly `json.dumps`'s; over it, `json.dumps`'s first characters."""
    assert encode_capped(value, 10**6) == json.dumps(value)
    assert encode_capped(value, 50).split("\n[truncated")[0] == json.dumps(value)[:50]
