"""RemotePolicy against scripted servers (`httpx.MockTransport`) and closed ports: the wire format,
token exactness, retries and their bounds, context overflow, session affinity, and the engine's
failure records when a server misbehaves."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time

import httpx
import pytest

from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.policy import GenerationRequest, SamplingParams
from gym_bridge.core.errors import BackendError, ContextOverflowError
from gym_bridge.core.task import parse_task
from gym_bridge.policies.remote import RemotePolicy
from gym_bridge.policies.http import RequestTimeoutError, normalize_base_url
from gym_bridge.core.dialects.completions import parse_completion
from tests.support.invariants import assert_token_invariants

URL = "http://server-a:8000/v1"
EOS = 2


def completion(token_ids, logprobs, *, finish_reason="stop", text="hi", with_ids=True, prompt_ids=None, **choice):
    """A vLLM-shaped /v1/completions answer."""
    entry = {
        "index": 0, "text": text, "finish_reason": finish_reason, "stop_reason": None,
        "logprobs": {"text_offset": list(range(len(token_ids))), "token_logprobs": logprobs,
                     "tokens": [f"token_id:{t}" for t in token_ids], "top_logprobs": [{f"token_id:{t}": lp} for t, lp in zip(token_ids, logprobs)]},
        **choice,
    }
    if with_ids:
        entry["token_ids"] = token_ids
        if prompt_ids is not None:
            entry["prompt_token_ids"] = prompt_ids
    return {"id": "cmpl-1", "object": "text_completion", "model": "m", "choices": [entry],
            "usage": {"prompt_tokens": 3, "completion_tokens": len(token_ids), "total_tokens": 3 + len(token_ids)}}


class Script:
    """A mock server: answers each request with the next scripted response (or a callable's), recording requests."""

    def __init__(self, *responses):
        self.responses = list(responses)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        response = self.responses.pop(0) if len(self.responses) > 1 else self.responses[0]
        if callable(response):
            response = response(request)
        if isinstance(response, Exception):
            raise response
        return response

    def bodies(self):
        return [json.loads(request.content) for request in self.requests]


def policy_for(script, urls=(URL,), **kwargs):
    kwargs.setdefault("backoff_s", 0.01)
    kwargs.setdefault("max_backoff_s", 0.02)
    kwargs.setdefault("rng", random.Random(0))
    return RemotePolicy(list(urls), model="m", transport=httpx.MockTransport(script), **kwargs)


def generate(policy, prompt=(1, 2, 3), session_id="s", **sampling):
    request = GenerationRequest(prompt_ids=list(prompt), sampling=SamplingParams(**sampling), session_id=session_id)
    return asyncio.run(policy.generate(request))


def test_request_body_is_token_in_with_every_sampling_field():
    script = Script(httpx.Response(200, json=completion([5, 6, EOS], [-0.1, -0.2, -0.3])))
    generate(policy_for(script), temperature=0.0, top_p=0.9, max_new_tokens=7, stop=("</a>",), seed=3)
    generate(policy_for(script), top_k=5, logprobs_mode="processed")
    first, second = script.bodies()
    assert first["prompt"] == [1, 2, 3] and first["model"] == "m"
    assert (first["temperature"], first["top_p"], first["top_k"], first["max_tokens"]) == (0.0, 0.9, -1, 7)  # top_k 0 -> vLLM's -1
    assert (first["stop"], first["seed"], first["include_stop_str_in_output"]) == (["</a>"], 3, True)
    # log-probs of the sampled tokens only (vLLM's cheapest form); ids as "token_id:N"; the first call of a session echoes its prompt
    assert first["return_token_ids"] is True and first["logprobs"] == 0 and first["return_tokens_as_token_ids"] is True
    assert (first["min_p"], first["repetition_penalty"], first["presence_penalty"], first["frequency_penalty"]) == (0.0, 1.0, 0.0, 0.0)
    assert "logprobs_mode" not in first and first["n"] == 1 and first["stream"] is False
    assert second["top_k"] == 5 and second["logprobs_mode"] == "processed"


def test_only_the_first_call_of_a_session_asks_for_the_prompt_echo():
    script = Script(httpx.Response(200, json=completion([5], [-0.5])))
    policy = policy_for(script)
    for session in ("a", "a", "b", "a", "", ""):
        generate(policy, session_id=session)
    # a session's later calls skip the echo (it grows with the conversation); calls without a session always ask
    assert ["return_token_ids" in body for body in script.bodies()] == [True, False, True, False, True, True]
    assert all(body["return_tokens_as_token_ids"] is True and body["logprobs"] == 0 for body in script.bodies())


def test_sampled_ids_eos_included_and_text_as_returned():
    script = Script(httpx.Response(200, json=completion([5, 6, EOS], [-0.1, -0.2, -0.3], text="ab", prompt_ids=[1, 2, 3])))
    generation = generate(policy_for(script))
    assert generation.token_ids == [5, 6, EOS]  # the EOS the server stopped on is a sampled token
    assert generation.logprobs == [-0.1, -0.2, -0.3]
    assert (generation.finish_reason, generation.text) == ("stop", "ab")
    assert generation.metrics["attempts"] == 1.0


def test_token_id_strings_are_the_fallback_when_token_ids_are_missing():
    script = Script(httpx.Response(200, json=completion([7, 8], [-1.0, -2.0], with_ids=False, finish_reason="length")))
    generation = generate(policy_for(script))
    assert (generation.token_ids, generation.logprobs, generation.finish_reason) == ([7, 8], [-1.0, -2.0], "length")


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (httpx.Response(200, text="<html>not json</html>"), "answer is not JSON"),
        (httpx.Response(200, json={"choices": []}), "answer has no choices"),
        (httpx.Response(200, json=completion([7, 8], [-1.0])), "log-probs must be on"),
        (httpx.Response(200, json={**completion([7, 8], [-1.0, -2.0]), "choices": [
            {**completion([7, 8], [-1.0, -2.0])["choices"][0], "token_ids": [7, 9]}]}), "disagree"),
        (httpx.Response(200, json=completion([7], [-1.0], finish_reason="abort")), "finish_reason 'abort'"),
        (httpx.Response(200, json={"choices": [{"text": "x", "finish_reason": "stop"}]}), "no token ids"),
    ],
)
def test_garbage_answers_are_retried_then_raised(answer, reason):
    script = Script(answer)
    with pytest.raises(BackendError, match=reason):
        generate(policy_for(script, max_retries=2))
    assert len(script.requests) == 3  # 1 + max_retries


def test_5xx_and_429_are_retried_with_backoff_then_succeed():
    ok = httpx.Response(200, json=completion([5, EOS], [-0.5, -0.1]))
    script = Script(httpx.Response(500, json={"error": {"message": "boom"}}), httpx.Response(429, headers={"retry-after": "0"}), ok)
    generation = generate(policy_for(script, max_retries=3))
    assert generation.token_ids == [5, EOS] and generation.metrics["attempts"] == 3.0


def test_a_server_that_stays_down_fails_within_the_bound():
    script = Script(httpx.Response(503, json={"error": {"message": "engine dead"}}))
    policy = policy_for(script, max_retries=3, backoff_s=0.05, max_backoff_s=0.1)
    started = time.perf_counter()
    with pytest.raises(BackendError, match=r"4 attempts failed.*HTTP 503: engine dead"):
        generate(policy)
    # backoffs: 0.05, 0.1, 0.1 at most (times a jitter factor in [0.5, 1])
    assert len(script.requests) == 4 and time.perf_counter() - started < 1.0


def test_a_timed_out_request_is_not_retried():
    """A server still computing would have its generation cancelled and restarted by each retry (issue 19, item 15)."""
    calls = []

    async def hang(request):
        calls.append(request)
        await asyncio.sleep(30)

    policy = RemotePolicy(URL, model="m", transport=httpx.MockTransport(hang), request_timeout_s=0.2, max_retries=3,
                          backoff_s=0.01, max_backoff_s=0.01)
    started = time.perf_counter()
    with pytest.raises(RequestTimeoutError, match="request timed out after 0.2 s .*not retried"):
        generate(policy)
    assert len(calls) == 1 and time.perf_counter() - started < 0.2 + 0.5  # one attempt, not 4 x 0.2 s


def test_a_listening_server_that_never_answers_over_real_tcp():
    with socket.socket() as sock:  # accepts connections (the kernel's backlog) and never reads or answers
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        policy = RemotePolicy(f"http://127.0.0.1:{sock.getsockname()[1]}/v1", model="m", request_timeout_s=0.3, max_retries=1,
                              backoff_s=0.01, max_backoff_s=0.01)
        started = time.perf_counter()
        with pytest.raises(BackendError, match="request timed out after 0.3 s"):
            generate(policy)
        assert time.perf_counter() - started < 1.0


def test_connection_errors_and_5xx_are_still_retried_after_the_timeout_change():
    script = Script(httpx.ConnectError("refused"), httpx.Response(503, json={"error": {"message": "busy"}}),
                    httpx.Response(200, json=completion([5, EOS], [-0.1, -0.2])))
    assert generate(policy_for(script, max_retries=2)).token_ids == [5, EOS]
    assert len(script.requests) == 3


def test_an_unreachable_server_fails_fast_over_real_tcp():
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    policy = RemotePolicy(f"http://127.0.0.1:{port}/v1", model="m", request_timeout_s=2.0, max_retries=2, backoff_s=0.01)
    with pytest.raises(BackendError, match="ConnectError"):
        generate(policy)


def test_context_overflow_is_typed_and_not_retried():
    message = ("This model's maximum context length is 2048 tokens. However, you requested 2100 tokens "
               "(100 in the messages, 2000 in the completion). Please reduce the length of the messages or completion.")
    script = Script(httpx.Response(400, json={"error": {"message": message, "type": "BadRequestError", "code": 400}}))
    with pytest.raises(ContextOverflowError, match="maximum context length is 2048"):
        generate(policy_for(script))
    assert len(script.requests) == 1


@pytest.mark.parametrize(("status", "body"), [(404, {"error": {"message": "The model `m` does not exist."}}),
                                              (401, {"message": "bad key"}), (422, {"detail": "prompt: field required"})])
def test_other_4xx_are_raised_at_once(status, body):
    script = Script(httpx.Response(status, json=body))
    with pytest.raises(BackendError, match=f"HTTP {status}"):
        generate(policy_for(script))
    assert len(script.requests) == 1


def test_a_server_that_rewrites_the_prompt_is_an_error():
    script = Script(httpx.Response(200, json=completion([5], [-0.5], prompt_ids=[0, 1, 2, 3])))  # a BOS was added
    with pytest.raises(BackendError, match="other prompt ids"):
        generate(policy_for(script))


def test_sessions_stick_to_one_server_and_spread_over_servers():
    seen: dict[int, set[str]] = {}

    def answer(request):
        session = json.loads(request.content)["prompt"][0]  # each rollout's prompt names it
        seen.setdefault(session, set()).add(request.url.host)
        return httpx.Response(200, json=completion([5], [-0.5]))

    urls = ["http://a:1/v1", "http://b:1/v1", "http://c:1/v1"]
    policy = RemotePolicy(urls, model="m", transport=httpx.MockTransport(answer))

    async def rollout(session: int):
        for turn in range(4):
            prompt = [session] + [9] * turn
            await policy.generate(GenerationRequest(prompt_ids=prompt, sampling=SamplingParams(), session_id=f"{session}-0"))

    async def rollouts():
        await asyncio.gather(*(rollout(session) for session in range(30)))

    asyncio.run(rollouts())
    assert len(seen) == 30 and all(len(hosts) == 1 for hosts in seen.values())  # every call of a rollout on one server
    assert {host for hosts in seen.values() for host in hosts} == {"a", "b", "c"}


def test_a_dead_server_s_sessions_move_to_a_live_one():
    def answer(request):
        if request.url.host == "a":
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, json=completion([5], [-0.5]))

    policy = RemotePolicy(["http://a:1/v1", "http://b:1/v1"], model="m", transport=httpx.MockTransport(answer),
                          max_retries=1, backoff_s=0.0)
    for session in map(str, range(6)):
        generation = generate(policy, session_id=session)
        assert generation.metrics["server"] == 1.0


def test_successive_event_loops_each_get_a_working_client():
    script = Script(httpx.Response(200, json=completion([5], [-0.5])))
    policy = policy_for(script)
    for _ in range(3):
        assert generate(policy).token_ids == [5]

    async def close():
        await policy.aclose()

    asyncio.run(close())


def test_base_urls_are_normalized():
    assert normalize_base_url("http://h:8000") == "http://h:8000/v1"
    assert normalize_base_url("http://h:8000/v1/") == "http://h:8000/v1"
    with pytest.raises(ValueError, match="not an http"):
        normalize_base_url("h:8000")


def test_parse_completion_rejects_too_many_tokens():
    request = GenerationRequest(prompt_ids=[1], sampling=SamplingParams(max_new_tokens=1))
    from gym_bridge.core.dialects.completions import MalformedAnswerError

    with pytest.raises(MalformedAnswerError, match="2 tokens returned for max_tokens=1"):
        parse_completion(completion([5, 6], [-0.1, -0.2]), request=request)


def test_engine_records_infra_failures_only_for_the_rollouts_a_server_failed(smol_tokenizer, smol_template):
    """Rollout 1-0's calls get 500s; the others succeed: one `infra` record, masked, and two scored ones."""
    answer_ids = smol_tokenizer.encode("All done.", add_special_tokens=False) + [smol_tokenizer.eos_token_id]

    failing_prompt = smol_template.prompt_ids([{"role": "user", "content": "Say done 1."}], None)

    def answer(request):
        if json.loads(request.content)["prompt"] == failing_prompt:
            return httpx.Response(500, json={"error": {"message": "kaput"}})
        return httpx.Response(200, json=completion(answer_ids, [-0.5] * len(answer_ids), text="All done."))

    policy = RemotePolicy(URL, model="m", transport=httpx.MockTransport(answer), max_retries=1, backoff_s=0.0)
    tasks = [parse_task({"prompt": f"Say done {i}.", "environment": "math", "expected_answer": "1"}, index=i) for i in range(3)]

    async def run():
        return [record async for record in Engine(policy, smol_template, EngineConfig(max_concurrency=1)).stream(tasks)]

    records = sorted(asyncio.run(run()), key=lambda record: record.task_index)
    assert [record.failure_kind for record in records] == [None, "infra", None]
    assert records[1].mask_sample and "HTTP 500: kaput" in records[1].failure_reason
    for record in records:
        assert_token_invariants(record.to_dict())
    assert records[0].tokens.completion_ids == answer_ids


def test_the_remote_policies_speak_http_through_one_client_module():
    """Issue 29: one HTTP client. Among the policies, only policies/http.py imports aiohttp (the keep-alive pools,
    the start-up probes); `RemotePolicy` holds one `HttpClient`, and the transport names import from http
    and discovery only (issue 37: no re-export through remote)."""
    import ast
    from pathlib import Path

    from gym_bridge.policies import http, remote

    folder = Path(http.__file__).parent
    importers = sorted(path.name for path in folder.glob("*.py") if any(
        (isinstance(node, ast.Import) and any(alias.name.split(".")[0] == "aiohttp" for alias in node.names))
        or (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "aiohttp")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))))
    assert importers == ["http.py"]
    policy = RemotePolicy("http://127.0.0.1:9/v1", model="m")
    assert isinstance(policy.http, http.HttpClient)
    assert [name for name in ("HttpAnswer", "ServerUnreachableError", "served_models", "KEEPALIVE_S") if hasattr(remote, name)] == []
