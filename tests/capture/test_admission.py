"""Budgets of a capture session hold for concurrent calls: a call counts against `max_turns` when it
arrives, reserves its token cap before it generates, at most `max_parallel_calls` generations of one
session run at once, and closing the session ends the generations still running. Real loopback
server and `openai` client; the policy is the scripted one, slowed so calls overlap."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import openai
import pytest

from gym_bridge.capture import HarnessEnvironment
from gym_bridge.capture.server import capture_server
from gym_bridge.capture.ledger import SessionLedger
from gym_bridge.capture.session import CaptureSession
from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.policy import Generation, GenerationRequest, SamplingParams, ScriptedPolicy
from gym_bridge.core.task import parse_task

MESSAGES = [{"role": "user", "content": "hi"}]


@dataclass
class SlowPolicy:
    """The scripted policy behind a delay, counting the generations running at once."""

    inner: ScriptedPolicy
    delay_s: float = 0.05
    running: int = 0
    peak: int = 0
    cancelled: int = 0
    caps: list[int] = field(default_factory=list)

    async def generate(self, request: GenerationRequest) -> Generation:
        self.running += 1
        self.peak = max(self.peak, self.running)
        self.caps.append(request.sampling.max_new_tokens)
        try:
            await asyncio.sleep(self.delay_s)
            return await self.inner.generate(request)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.running -= 1

    async def aclose(self) -> None:
        """Nothing to release."""


def eight_tokens(turn) -> Generation:  # type: ignore[no-untyped-def]
    generation = turn("one two three four five six seven")
    assert len(generation.token_ids) == 8  # 7 words + EOS with SmolLM2's tokenizer
    return generation


async def burst(session: CaptureSession, calls: int) -> tuple[list[object], list[BaseException]]:
    """`calls` chat completions sent at once; the answers and the errors."""
    async with capture_server().session(session) as base_url:
        async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
            results = await asyncio.gather(*(client.chat.completions.create(model="policy", messages=MESSAGES) for _ in range(calls)),
                                           return_exceptions=True)
    return [r for r in results if not isinstance(r, BaseException)], [r for r in results if isinstance(r, BaseException)]


def budget_errors(errors: list[BaseException]) -> bool:
    return all(isinstance(e, openai.BadRequestError) and e.status_code == 400 and e.code == "rollout_budget_exceeded" for e in errors)


def test_twenty_calls_at_once_against_a_limit_of_two_calls_get_two_answers(smol_template, turn) -> None:
    policy = SlowPolicy(ScriptedPolicy({"": [eight_tokens(turn)] * 20}))

    async def main() -> tuple[CaptureSession, list[object], list[BaseException]]:
        session = CaptureSession(policy=policy, template=smol_template, ledger=SessionLedger(sampling=SamplingParams(max_new_tokens=8),
                                 limits=Limits(max_turns=2), model_name="policy", label="t"))
        answers, errors = await burst(session, 20)
        return session, answers, errors

    session, answers, errors = asyncio.run(main())
    assert len(answers) == 2 and len(errors) == 18 and budget_errors(errors)
    assert len(session.ledger.calls) == 2 and len(policy.inner.calls) == 2
    assert session.ledger.stop is not None and session.ledger.stop.kind == "max_turns" and session.ledger.stopped.is_set()
    assert policy.peak == 1  # one generation of the session at a time (max_parallel_calls=1)


def test_twenty_calls_at_once_against_a_budget_of_forty_tokens_spend_forty(smol_template, turn) -> None:
    policy = SlowPolicy(ScriptedPolicy({"": [eight_tokens(turn)] * 20}))

    async def main() -> tuple[CaptureSession, list[object], list[BaseException]]:
        session = CaptureSession(policy=policy, template=smol_template, ledger=SessionLedger(sampling=SamplingParams(max_new_tokens=8),
                                 limits=Limits(max_turns=20, max_completion_tokens=40), model_name="policy", label="t"))
        answers, errors = await burst(session, 20)
        return session, answers, errors

    session, answers, errors = asyncio.run(main())
    # 40 tokens / 8 per call = 5 calls served; the 6th finds the budget spent, like a sequential 6th call
    assert len(answers) == 5 and len(errors) == 15 and budget_errors(errors)
    assert sum(len(call.completion_ids) for call in session.ledger.calls) == 40
    assert session.ledger.stop is not None and session.ledger.stop.kind == "budget"


def test_parallel_calls_are_bounded_by_the_setting_and_reserve_their_token_caps(smol_template, turn) -> None:
    policy = SlowPolicy(ScriptedPolicy({"": [eight_tokens(turn)] * 20}), delay_s=0.5)

    async def main() -> CaptureSession:
        session = CaptureSession(policy=policy, template=smol_template, ledger=SessionLedger(sampling=SamplingParams(max_new_tokens=16),
                                 limits=Limits(max_turns=20, max_completion_tokens=40), model_name="policy", label="t",
                                 max_parallel_calls=3))
        await burst(session, 20)
        return session

    session = asyncio.run(main())
    assert policy.peak == 3
    # the first three run together: caps 16 + 16 reserved, the third gets the 8 left (40 - 32)
    assert policy.caps[:3] == [16, 16, 8]
    assert sum(policy.caps[:3]) <= 40 and sum(len(call.completion_ids) for call in session.ledger.calls) <= 40


def test_closing_the_session_ends_a_generation_still_running(smol_template, turn) -> None:
    policy = SlowPolicy(ScriptedPolicy({"": [turn("never sent")]}), delay_s=60)

    async def main() -> BaseException | object:
        session = CaptureSession(policy=policy, template=smol_template, ledger=SessionLedger(sampling=SamplingParams(max_new_tokens=8),
                                 limits=Limits(), model_name="policy", label="t"))
        async with openai.AsyncOpenAI(base_url="http://unused", api_key="unused", max_retries=0) as client:
            async with capture_server().session(session) as base_url:
                call = asyncio.ensure_future(client.with_options(base_url=base_url).chat.completions.create(
                    model="policy", messages=MESSAGES))
                while policy.running == 0:
                    await asyncio.sleep(0.01)
            result = await asyncio.gather(call, return_exceptions=True)
        return result[0]

    result = asyncio.run(asyncio.wait_for(main(), 30))
    assert policy.cancelled == 1 and policy.running == 0
    assert isinstance(result, openai.BadRequestError) and "harness ended while this call was generating" in result.message


async def fan_out(client: openai.AsyncOpenAI, task: dict) -> str:
    """An agent that sends 20 calls at once and answers with the first reply."""
    replies = await asyncio.gather(*(client.chat.completions.create(model=task["model"], messages=task["messages"])
                                     for _ in range(20)), return_exceptions=True)
    answered = [reply for reply in replies if not isinstance(reply, BaseException)]
    return answered[0].choices[0].message.content or "" if answered else ""


class FanOut(HarnessEnvironment):
    name = "fan_out_harness"
    agent = fan_out

    def score(self, task, answer):  # type: ignore[no-untyped-def]
        return 1.0


@pytest.mark.parametrize(("limits", "finish", "calls"), [({"max_turns": 2}, "max_turns", 2),
                                                          ({"max_completion_tokens": 40}, "budget", 5)])
def test_a_harness_calling_past_its_limits_at_once_finishes_as_the_limit_not_as_an_answer(smol_template, turn, limits, finish, calls) -> None:
    policy = SlowPolicy(ScriptedPolicy({"": [eight_tokens(turn)] * 20}))
    config = EngineConfig(sampling=SamplingParams(max_new_tokens=8), limits=Limits(**{"max_turns": 20, **limits}), deadline_s=60,
                          template_check="off")
    task = parse_task({"responses_create_params": {"input": "hi"}, "agent_ref": {"name": "fan_out_harness"}}, index=0)
    record = asyncio.run(Engine(policy, smol_template, config).rollout(task, env_class=FanOut)).to_dict()
    assert record["failure_kind"] is None, record["failure_reason"]
    assert record["metrics"]["finish_reason"] == finish and len(policy.inner.calls) == calls
    assert record["metrics"]["verify"]["model_calls"] == calls and policy.peak == 1
