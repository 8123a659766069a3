"""serve-model and its batching policy under abuse (issue 9 item 11): clients that disconnect,
batches bounded by tokens, memory handed back after big batches, deeply nested JSON."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from gym_bridge.core.policy import GenerationRequest, SamplingParams
from gym_bridge.policies import transformers as transformers_policy
from gym_bridge.policies.transformers import TransformersPolicy
from gym_bridge.core.task import MAX_ROW_DEPTH
from gym_bridge.serve.model_server import build_app
from tests.support.http_server import app_in_thread


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    policy = TransformersPolicy.from_pretrained(tiny_model_dir, device="cpu", batch_wait_s=0.01)
    with app_in_thread(build_app(policy, model_name="tiny")) as url:
        yield url


def test_a_client_that_disconnects_cancels_its_generation(server):
    """Item 11: a 3,000-token greedy generation (tens of seconds on this model) whose client gives
    up after 0.5 s stops; the next request is served at once instead of waiting behind it."""
    long = {"prompt": [1, 504, 3, 22], "max_tokens": 3000, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server + "/v1/completions", json=long, timeout=httpx.Timeout(30, read=0.5))
    started = time.monotonic()
    answer = httpx.post(server + "/v1/completions", json={**long, "max_tokens": 2}, timeout=20)
    assert answer.status_code == 200 and len(answer.json()["choices"][0]["text"]) > 0
    assert time.monotonic() - started < 8


def tool_nested(depth: int) -> str:
    """A chat body whose tool parameters hold `depth` nested lists, the innermost `depth + 5` levels down
    (body 1, tools 2, tool 3, function 4, parameters 5)."""
    nested = "[" * depth + "]" * depth
    return ('{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "tools": [{"type": "function", "function": '
            '{"name": "f", "parameters": {"x": ' + nested + "}}}]}")


@pytest.mark.parametrize("depth", [100_000, MAX_ROW_DEPTH - 4])
def test_deeply_nested_json_is_a_400(server, depth):
    """Item 11: a body nested 100,000 deep (which overflows the JSON parser's recursion) and one just
    over the limit (201 levels), inside a tool's parameters, are both 400s naming the limit, not 500s."""
    answer = httpx.post(server + "/v1/chat/completions", content=tool_nested(depth), headers={"content-type": "application/json"}, timeout=30)
    assert answer.status_code == 400
    assert f"nested too deeply: more than {MAX_ROW_DEPTH} levels" in answer.json()["error"]["message"]


def test_a_body_nested_to_the_limit_is_served(server):
    """Issue 37 item 5: the three servers share one depth limit (a row's, 200 levels); serve-model's was 64, so
    this body (200 levels) was a 400 before; it renders and generates now."""
    answer = httpx.post(server + "/v1/chat/completions", content=tool_nested(MAX_ROW_DEPTH - 5),
                        headers={"content-type": "application/json"}, timeout=60)
    assert answer.status_code == 200, answer.text


def generate_all(policy, requests):
    async def run():
        return await asyncio.gather(*(policy.generate(request) for request in requests))

    return asyncio.run(run())


def request(prompt_length, max_new_tokens):
    return GenerationRequest(prompt_ids=list(range(1, prompt_length + 1)), sampling=SamplingParams(temperature=0, max_new_tokens=max_new_tokens))


def test_batches_are_bounded_by_padded_tokens(tiny_model_dir):
    """Item 11: with `max_batch_tokens=100`, four concurrent 30+10-token requests run two per batch
    (2 x 40 = 80 fits, 3 x 40 = 120 does not), none is lost, and a request wider than the bound
    runs alone."""
    policy = TransformersPolicy.from_pretrained(tiny_model_dir, device="cpu", batch_wait_s=0.2, max_batch_tokens=100)
    generations = generate_all(policy, [request(30, 10) for _ in range(4)])
    assert [generation.metrics["batch_size"] for generation in generations] == [2.0] * 4
    assert all(len(generation.token_ids) == 10 for generation in generations)
    [alone] = generate_all(policy, [request(140, 5)])
    assert alone.metrics["batch_size"] == 1.0 and len(alone.token_ids) == 5
    unbounded = TransformersPolicy.from_pretrained(tiny_model_dir, device="cpu", batch_wait_s=0.2)
    assert [g.metrics["batch_size"] for g in generate_all(unbounded, [request(30, 10) for _ in range(4)])] == [4.0] * 4


def test_memory_is_released_after_big_batches_only(tiny_model_dir, monkeypatch):
    """Item 11: after a batch of at least `release_memory_above_tokens` padded tokens the policy
    hands memory back (gc, CUDA cache, malloc_trim); smaller batches skip that cost."""
    transformers_policy.release_memory(transformers_policy.torch.device("cpu"))  # runs on this platform
    released = []
    monkeypatch.setattr(transformers_policy, "release_memory", released.append)
    policy = TransformersPolicy.from_pretrained(tiny_model_dir, device="cpu", release_memory_above_tokens=60)
    generate_all(policy, [request(10, 5)])
    assert released == []
    generate_all(policy, [request(60, 5)])
    assert [device.type for device in released] == ["cpu"]


def test_a_cancelled_request_logs_one_line_and_no_traceback(server, caplog):
    """Issue 19 item 15: each cancelled request is one log line, not `_GatheringFuture exception was never
    retrieved` tracebacks (44 of them in the laptop run)."""
    import gc
    import logging

    caplog.set_level(logging.WARNING)
    long = {"prompt": [[1, 504, 3, 22], [1, 7, 8]], "max_tokens": 3000, "temperature": 0}  # two prompts: one gather
    for _ in range(2):
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server + "/v1/completions", json=long, timeout=httpx.Timeout(30, read=0.5))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len([r for r in caplog.records if "request cancelled" in r.getMessage()]) < 2:
        time.sleep(0.05)
    assert httpx.post(server + "/v1/completions", json={**long, "max_tokens": 2}, timeout=20).status_code == 200
    gc.collect()
    messages = [record.getMessage() for record in caplog.records]
    assert len([m for m in messages if "request cancelled after" in m and "client disconnected (2 prompt(s)" in m]) == 2, messages
    assert not [m for m in messages if "never retrieved" in m], messages
