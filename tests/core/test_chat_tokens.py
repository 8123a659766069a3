"""The chat path with token ids: a `ChatPolicy` whose server reports each call's prompt and generation
ids (NeMo RL's chat endpoint) gives records with a token stream, checked to be contiguous."""

from __future__ import annotations

import asyncio

from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.policy import ScriptedChatPolicy
from gym_bridge.core.task import parse_task
from gym_bridge.core.turn import CallTokens, Turn
from tests.support.invariants import assert_token_invariants

CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
ROW = {"responses_create_params": {"input": "Weather in Oslo?"}, "environment": "weather"}


def token_chat(turns: list[tuple[str, list[int] | None, list[int] | None]]) -> ScriptedChatPolicy:
    """Answers each call with the next (text, prompt ids, generation ids), each sampled id at log-prob -0.5."""
    return ScriptedChatPolicy({"": [Turn(text=text, tokens=None if prompt is None or generation is None else
                                             CallTokens(prompt, generation, [-0.5] * len(generation)))
                                    for text, prompt, generation in turns]})


def rollout(policy: ScriptedChatPolicy):
    return asyncio.run(Engine(policy, None, EngineConfig()).rollout(parse_task(ROW, index=0)))


def test_contiguous_calls_give_a_token_stream_and_send_the_ids_back():
    # call 1: prompt [1, 2, 3], sampled [10, 11]; call 2: the server rendered the tool output as [20, 21]
    policy = token_chat([(CALL, [1, 2, 3], [10, 11]), ("Cold.", [1, 2, 3, 10, 11, 20, 21], [30, 31])])
    record = rollout(policy)
    assert record.failure_kind is None and record.reward == 1.0
    tokens = record.tokens
    assert tokens.prompt_ids == [1, 2, 3]
    assert tokens.completion_ids == [10, 11, 20, 21, 30, 31] and tokens.completion_mask == [1, 1, 0, 0, 1, 1]
    assert tokens.completion_logprobs == [-0.5, -0.5, 0.0, 0.0, -0.5, -0.5]
    assert_token_invariants(record.to_dict())
    [assistant] = [m for m in policy.requests[1].messages if m["role"] == "assistant"]
    assert (assistant["prompt_token_ids"], assistant["generation_token_ids"]) == ([1, 2, 3], [10, 11])
    assert record.usage() == {"input_tokens": 5, "output_tokens": 4, "total_tokens": 9}


def test_a_prompt_that_rewrites_earlier_tokens_fails_the_rollout():
    policy = token_chat([(CALL, [1, 2, 3], [10, 11]), ("Cold.", [1, 2, 3, 12, 11, 20], [30])])
    record = rollout(policy)
    assert record.failure_kind == "infra" and record.mask_sample
    assert "call 2 do not start with the 5 tokens of the earlier calls (first difference at position 3)" in record.failure_reason


def test_token_ids_on_some_calls_only_fail_the_rollout():
    policy = token_chat([(CALL, None, None), ("Cold.", [1, 2, 3], [30])])
    assert rollout(policy).failure_kind == "infra"
