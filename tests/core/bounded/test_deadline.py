"""The rollout deadline under a trainer that parks model calls (issue 30, item 4b).

A policy with `parks_calls = True` (verl's agent loop) may sit inside `generate` for a whole train step
and weight update: that time is not the rollout's. The deadline still bounds setup, tools and verify, and
each parked call has its own bound (`EngineConfig.generation_timeout_s`). Other policies keep the old rule:
their calls count against the deadline. Scripted policies and the embedded model's real template.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from gym_bridge.core.bounded.deadline import RolloutDeadline
from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.environment import Environment, VerifyResult, tool
from gym_bridge.core.policy import ScriptedPolicy
from gym_bridge.core.registry import register
from gym_bridge.core.task import parse_task

CALL = '<tool_call>\n{"name": "wait", "arguments": {"seconds": %s}}\n</tool_call>'


@register
class Waiting(Environment):
    name = "waiting_for_deadline_test"
    tool_timeout_s = 5.0

    @tool
    async def wait(self, seconds: float) -> dict:
        """Wait a while.

        Args:
            seconds: How long.
        """
        await asyncio.sleep(seconds)
        return {"waited": seconds}

    async def verify(self, task, output):
        return VerifyResult(reward=1.0)


class Parked(ScriptedPolicy):
    """A trainer's policy: each call sits `parked_s` in `generate` (a train step and a weight update) first."""

    parks_calls = True
    parked_s = 0.0

    async def generate(self, request):
        await asyncio.sleep(self.parked_s)
        return await super().generate(request)


class Unparked(Parked):
    parks_calls = False


def rollout(policy, template, **config):
    task = parse_task({"agent_ref": {"name": "waiting_for_deadline_test"}, "messages": [{"role": "user", "content": "wait"}]}, index=0)
    engine = Engine(policy, template, EngineConfig(template_check="off", **config))
    started = time.perf_counter()
    record = asyncio.run(engine.rollout(task))
    return record, time.perf_counter() - started


def test_time_parked_in_a_model_call_is_not_the_rollouts(smol_template, turn):
    # two calls parked 0.4 s each = 0.8 s of generation, plus a 0.1 s tool, under a 0.5 s deadline
    policy = Parked({"": [turn(CALL % 0.1), turn("done")]})
    policy.parked_s = 0.4
    record, elapsed_s = rollout(policy, smol_template, deadline_s=0.5)
    assert (record.failure_kind, record.finish_reason, record.reward, record.turns) == (None, "answer", 1.0, 2)
    assert elapsed_s > 0.8  # longer than the deadline, and scored


def test_calls_of_a_policy_that_is_never_parked_still_count(smol_template, turn):
    # the same rollout with the policy's old rule: 0.4 s into the second call, the 0.5 s deadline passes
    policy = Unparked({"": [turn(CALL % 0.1), turn("done")]})
    policy.parked_s = 0.4
    record, _ = rollout(policy, smol_template, deadline_s=0.5)
    assert record.failure_kind == "timeout" and "deadline of 0.5 s" in record.failure_reason


def test_environment_time_stays_under_the_deadline_between_parked_calls(smol_template, turn):
    # parked calls excluded, tools are not: 0.3 s + 0.3 s of tools pass the 0.5 s deadline in the second tool
    policy = Parked({"": [turn(CALL % 0.3), turn(CALL % 0.3), turn("done")]})
    policy.parked_s = 0.2
    record, elapsed_s = rollout(policy, smol_template, deadline_s=0.5)
    assert record.failure_kind == "timeout" and "deadline of 0.5 s" in record.failure_reason
    assert record.tool_calls == 2 and elapsed_s < 1.5


def test_a_parked_call_has_a_bound_of_its_own(smol_template, turn):
    policy = Parked({"": [turn("done")]})
    policy.parked_s = 5.0
    record, elapsed_s = rollout(policy, smol_template, deadline_s=60, generation_timeout_s=0.3)
    assert record.failure_kind == "timeout" and "generation_timeout_s=0.3 s" in record.failure_reason
    assert elapsed_s < 2


def test_concurrent_parked_calls_hold_the_deadline_once():
    """A harness may have two calls in flight: the deadline stands still from the first's start to the
    last's end, and then has what it had left (0.3 s here)."""

    async def scenario() -> tuple[float, float]:
        deadline = RolloutDeadline(deadline_s=0.3, generation_timeout_s=5, parked=True)
        started = asyncio.get_running_loop().time()

        async def call(seconds: float) -> None:
            async with deadline.model_call():
                await asyncio.sleep(seconds)

        with pytest.raises(TimeoutError):
            async with deadline.running():
                await asyncio.gather(call(0.4), call(0.6))  # the deadline stands still 0.6 s
                await asyncio.sleep(1.0)  # then 0.3 s are left
        return asyncio.get_running_loop().time() - started, deadline.excluded_s

    elapsed_s, excluded_s = asyncio.run(scenario())
    assert 0.6 <= excluded_s < 0.7 and 0.9 <= elapsed_s < 1.2


async def one_call_agent(client, task: dict) -> str:
    reply = await client.chat.completions.create(model=task["model"], messages=list(task["messages"]))
    return reply.choices[0].message.content or ""


def test_a_harness_agents_parked_calls_are_not_the_rollouts(smol_template, turn):
    """A harness's model calls reach the policy through its capture server, not the agent loop's `generate`:
    they are held out of the deadline too (the agent's own `harness_timeout_s` still counts them)."""
    pytest.importorskip("openai")
    from gym_bridge.capture import HarnessEnvironment

    class OneCall(HarnessEnvironment):
        name = "one_call_harness_for_deadline_test"
        agent = one_call_agent
        harness_timeout_s = 10.0

        def score(self, task, answer):
            return float(answer == "done")

    policy = Parked({"": [turn("done")]})
    policy.parked_s = 0.6
    task = parse_task({"agent_ref": {"name": "one_call_harness_for_deadline_test"}, "messages": [{"role": "user", "content": "go"}]}, index=0)
    engine = Engine(policy, smol_template, EngineConfig(template_check="off", deadline_s=0.5))
    record = asyncio.run(engine.rollout(task, env_class=OneCall))
    assert (record.failure_kind, record.reward) == (None, 1.0), record.failure_reason


def test_the_async_workers_versioned_policy_is_parked_like_verls(smol_template, turn):
    # TRL's async trainer pauses generation ("keep") around every weight sync: the worker's policy wrapper
    # declares it, so a 0.8 s pause across two calls does not fail a rollout with a 0.5 s deadline
    from gym_bridge.policies.versioned import VersionedPolicy

    inner = Unparked({"": [turn(CALL % 0.1), turn("done")]})
    inner.parked_s = 0.4
    record, elapsed_s = rollout(VersionedPolicy(inner, lambda: 3), smol_template, deadline_s=0.5)
    assert (record.failure_kind, record.finish_reason, record.reward) == (None, "answer", 1.0)
    assert record.policy_versions == (3, 3) and elapsed_s > 0.8
