"""A session keeps a bounded log of its error answers: a harness that sends the same bad request thousands of
times (5,000 made a 1.4 MB record before issue 36) leaves the first and the latest errors in its record, each cut
to `MAX_ERROR_MESSAGE_CHARS`, and a count of those dropped between them."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from gym_bridge.capture.ledger import MAX_ERROR_MESSAGE_CHARS, MAX_KEPT_ERRORS, SessionLedger
from gym_bridge.capture.session import CaptureSession
from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.dialects.chat import ApiError
from gym_bridge.core.policy import SamplingParams, ScriptedPolicy
from tests.capture.test_harness_hardening import engine, rollout, shell_env


def test_five_thousand_error_answers_keep_the_first_and_latest_and_count_the_rest(smol_template, turn) -> None:
    session = CaptureSession(policy=ScriptedPolicy({"": [turn("ok")]}), template=smol_template,
                             ledger=SessionLedger(sampling=SamplingParams(max_new_tokens=8),
                             limits=Limits(), model_name="policy", label="t"))

    async def send_all() -> list[int]:
        statuses = []
        for number in range(5000):  # an unknown model whose name (2,000 characters) the 404 quotes
            body = {"model": f"m{number}-" + "x" * 2000, "messages": [{"role": "user", "content": "hi"}]}
            with pytest.raises(ApiError) as raised:
                await session.chat_completions(body)
            statuses.append(raised.value.status)
        return statuses

    assert asyncio.run(send_all()) == [404] * 5000
    errors = session.ledger.errors
    assert len(errors) == MAX_KEPT_ERRORS and session.ledger.errors_dropped == 5000 - MAX_KEPT_ERRORS  # 32 kept, 4,968 counted
    half = MAX_KEPT_ERRORS // 2
    assert [error.message.split("`")[1].split("-")[0] for error in errors] == (
        [f"m{n}" for n in range(half)] + [f"m{n}" for n in range(5000 - half, 5000)])  # the first 16 and the last 16
    # each message: 500 characters, then how many more there were (the 2,000-character name and the rest of the sentence)
    assert all(len(error.message) <= MAX_ERROR_MESSAGE_CHARS + 30 and error.message.endswith(" more characters)") for error in errors)
    assert len(json.dumps([f"{e.status}: {e.message}" for e in errors])) < 20_000  # was 5,000 messages of 2 KB


def test_the_record_carries_the_kept_errors_and_the_dropped_count(smol_template, turn) -> None:
    # the agent sends 40 requests for a model the endpoint does not serve, then one good call
    agent = ("import json, os, openai; task = json.load(open(os.environ['GYM_BRIDGE_TASK_FILE'])); c = openai.OpenAI(max_retries=0)\n"
             "for n in range(40):\n"
             "    try: c.chat.completions.create(model=f'nope{n}', messages=task['messages'])\n"
             "    except openai.NotFoundError: pass\n"
             "print(c.chat.completions.create(model=os.environ['OPENAI_MODEL'], messages=task['messages']).choices[0].message.content)")
    record = rollout(engine(smol_template, {"": [turn("42")]}), shell_env("", command=(sys.executable, "-c", agent)))
    verify = record["metrics"]["verify"]
    assert record["failure_kind"] is None and record["reward"] == 1.0, record["failure_reason"]
    assert len(verify["endpoint_errors"]) == MAX_KEPT_ERRORS and verify["endpoint_errors_dropped"] == 40 - MAX_KEPT_ERRORS
    assert verify["endpoint_errors"][0].startswith("404: The model `nope0` does not exist")
    assert verify["endpoint_errors"][-1].startswith("404: The model `nope39` does not exist")
