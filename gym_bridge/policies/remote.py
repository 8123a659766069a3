"""A `Policy` over OpenAI-compatible servers (`vllm serve`, `trl vllm-serve`, `gym-bridge serve-model`).

Each call is one `POST {base_url}/completions` whose prompt is the token ids, with log-probs of the
sampled tokens only (`logprobs: 0`) and `return_tokens_as_token_ids`, so the sampled ids arrive as
the `"token_id:N"` strings of the log-probs (or as `token_ids` where a server sends them). The
first call of each rollout also asks for `return_token_ids` and checks that the server's echo of
the prompt is the prompt sent; later calls skip the echo, whose size grows with the conversation.
All calls of one rollout (`GenerationRequest.session_id`) go to the same server, so its prefix
cache is reused; new rollouts go to the least busy server, and a server that stops answering is
skipped for `down_for_s` while its rollouts move to the next one.

HTTP goes through one `gym_bridge.policies.http.HttpClient` (aiohttp with keep-alive pools, one per
event loop, bounded in all and per server) and orjson; measured against httpx, it costs about a
tenth of the CPU per request (benchmarks/remote_throughput.py). Every attempt is bounded by `request_timeout_s`. A call that
never reached its server (connection refused or reset while connecting, connect timeout, unknown
host), 5xx, 429 and unusable answers (malformed, or holding ids outside the tokenizer's
`vocab_size`) are retried up to `max_retries` times with exponential backoff and jitter, on another
live server where there is one, then raised as `BackendError` naming the server and what was wrong
(the rollout fails as `infra`). A server is judged by whether its answer was usable: an HTTP 200
that is not counts as its error and takes it out of routing for `down_for_s`, like one that stops
answering. A call whose connection broke after the request was sent (the server
died or dropped it mid-answer) is a `ReplicaLostError` at once: the server may have generated, and
a resend would be a fresh sample (`retry_reached_calls=True` resends it anyway). A request that
times out is not retried: the server is most likely still generating it, and a retry would cancel
that work and start over from zero, so no retry could finish sooner. A 400 about the context length
is a `ContextOverflowError`; other 4xx are raised at once. So one call takes at most `max_call_s`.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson
from yarl import URL

from gym_bridge.core.dialects.completions import MalformedAnswerError, parse_completion, preview, request_fields
from gym_bridge.core.errors import BackendAnswerError, BackendError, ContextOverflowError
from gym_bridge.core.policy import Generation, GenerationRequest, SamplingParams
from gym_bridge.policies.http import (
    CONTEXT_OVERFLOW_PATTERN,
    HttpClient,
    ReplicaLostError,
    RequestTimeoutError,
    TransportError,
    error_message,
    normalize_base_url,
    retry_after_s,
)
from gym_bridge.policies.router import ReplicaRouter

if TYPE_CHECKING:
    import httpx


class _RetryableAnswer(Exception):
    """The server answered, but with something to retry (5xx, 429, a malformed body)."""

    def __init__(self, reason: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after_s = retry_after_s


class RemotePolicy:
    """Implements `Policy` by calling `/v1/completions` on one or more OpenAI-compatible servers.

    Log-probs: vLLM returns what its `--logprobs-mode` says (raw log-probs by default; start it
    with `--logprobs-mode processed_logprobs` for `logprobs_mode="processed"`, which in vLLM also
    applies top-k/top-p masks). `gym-bridge serve-model` honours each request's mode. Where the
    server reports the mode, a mismatch is a `BackendError`.
    """

    def __init__(
        self,
        base_urls: Sequence[str] | str,
        *,
        model: str,
        api_key: str | None = None,
        request_timeout_s: float = 120.0,
        connect_timeout_s: float = 10.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        down_for_s: float = 5.0,
        retry_reached_calls: bool = False,
        max_connections: int = 1024,
        max_connections_per_server: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
        vocab_size: int | None = None,
        rng: random.Random | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """`base_urls`: one URL or several (`http://host:8000/v1`); `model`: the served model name.

        `max_connections` bounds the pooled connections in all, `max_connections_per_server` (default:
        the same) those to one server; requests beyond wait for a free one. `extra_body` is merged
        into every request (server-specific fields). `vocab_size`: the size of the tokenizer the
        prompts are rendered with; an answer holding other ids is unusable (None: not checked).
        `retry_reached_calls`: a call whose connection
        broke after it was sent is retried like one that never reached its server (a fresh sample:
        the server may have generated already) instead of failing the rollout as `infra`. `rng`
        draws the backoff jitter. `transport` replaces the network with an httpx transport (tests
        pass `httpx.MockTransport`).
        """
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not urls:
            raise ValueError("RemotePolicy needs at least one base URL")
        if request_timeout_s <= 0 or max_retries < 0:
            raise ValueError("request_timeout_s must be positive and max_retries non-negative")
        if max_connections < 1 or (max_connections_per_server is not None and max_connections_per_server < 1):
            raise ValueError("max_connections and max_connections_per_server must be at least 1")
        self.base_urls = [normalize_base_url(url) for url in urls]
        self.model = model
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s = min(connect_timeout_s, request_timeout_s)
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.down_for_s = down_for_s
        self.retry_reached_calls = retry_reached_calls
        self.max_connections = max_connections
        self.max_connections_per_server = max_connections_per_server or max_connections
        self.extra_body = dict(extra_body or {})
        self.vocab_size = vocab_size
        self._rng = rng or random.Random()
        self.http = HttpClient(self.base_urls, api_key=api_key, max_connections=max_connections,
                               max_connections_per_server=self.max_connections_per_server, connect_timeout_s=self.connect_timeout_s,
                               transport=transport)
        """The one HTTP client every call goes through (its keep-alive pools, one per event loop)."""
        self._urls = [URL(url + "/completions", encoded=True) for url in self.base_urls]
        self.router = ReplicaRouter(self.base_urls, down_for_s=down_for_s)
        """Which server each call goes to (episode affinity, least busy, failover); a session it knows has had its prompt echo checked."""
        self._heads: dict[tuple[SamplingParams, bool], bytes] = {}

    @property
    def max_call_s(self) -> float:
        """The longest one `generate` call can take before it raises."""
        return (self.max_retries + 1) * self.request_timeout_s + self.max_retries * self.max_backoff_s

    async def generate(self, request: GenerationRequest) -> Generation:
        """Sample a continuation of `request.prompt_ids` on a server.

        Raises `ContextOverflowError` when the server says the prompt does not fit, `ReplicaLostError`
        when the connection broke after the request was sent, and `BackendError` after the retries
        are spent or on an answer that cannot be retried.
        """
        started = time.perf_counter()
        echo_prompt = not self.router.knows(request.session_id)
        body = self._encode(request, echo_prompt=echo_prompt)
        tried: set[int] = set()
        failures: list[str] = []
        retry_after_s: float | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                await asyncio.sleep(self._backoff_s(attempt, retry_after_s))
            server = self.router.choose(request.session_id, avoid=tried)
            tried.add(server)
            try:
                generation = await self._attempt(server, body, request)
            except _RetryableAnswer as answer:
                failures.append(f"{self.base_urls[server]}: {answer}")
                retry_after_s = answer.retry_after_s
                continue
            generation.metrics.update(latency_s=time.perf_counter() - started, attempts=float(attempt + 1), server=float(server))
            return generation
        elapsed_s = time.perf_counter() - started
        raise BackendAnswerError(
            f"{len(failures)} attempts failed in {elapsed_s:.1f} s (request timeout {self.request_timeout_s:g} s, "
            f"max_retries {self.max_retries}); last: {failures[-1]}"
        )

    def _encode(self, request: GenerationRequest, *, echo_prompt: bool) -> bytes:
        """The request body as JSON bytes: the sampling fields (serialized once per setting) and the prompt."""
        key = (request.sampling, echo_prompt)
        head = self._heads.get(key)
        if head is None:
            fields = request_fields(request.sampling, model=self.model)
            if echo_prompt:
                fields["return_token_ids"] = True
            fields.update(self.extra_body)
            fields.pop("prompt", None)
            head = orjson.dumps(fields)[:-1] + b',"prompt":'
            if len(self._heads) < 1024:
                self._heads[key] = head
        prompt = request.prompt_ids
        return head + orjson.dumps(prompt if isinstance(prompt, (list, tuple)) else list(prompt)) + b"}"

    async def _attempt(self, server: int, body: bytes, request: GenerationRequest) -> Generation:
        self.router.started(server)
        try:
            async with asyncio.timeout(self.request_timeout_s):
                answer = await self.http.post(self._urls[server], body)
        except TimeoutError:
            self.router.finished(server, ok=False)
            raise RequestTimeoutError(
                f"{self.base_urls[server]}: request timed out after {self.request_timeout_s:g} s (no answer; not retried, since "
                "the server may still be generating and a retry would start over): raise the request timeout"
            ) from None
        except TransportError as error:
            self.router.finished(server, ok=False, down=True)
            if error.reached and not self.retry_reached_calls:
                raise ReplicaLostError(
                    f"{self.base_urls[server]}: the connection broke after the request was sent ({error}): the replica "
                    "died or dropped the call mid-answer; not retried, since it may have generated (retry_reached_calls "
                    "resends it as a fresh sample)"
                ) from None
            raise _RetryableAnswer(str(error)) from None
        except BaseException:
            self.router.finished(server, ok=False)
            raise
        status = answer.status
        if status == 200:
            return self._usable(server, answer.body, request)
        self.router.finished(server, ok=False)
        message = error_message(answer)
        if status == 429 or status >= 500:
            raise _RetryableAnswer(f"HTTP {status}: {message}", retry_after_s=retry_after_s(answer.retry_after))
        url = self.base_urls[server] + "/completions"
        if status == 400 and CONTEXT_OVERFLOW_PATTERN.search(message):
            raise ContextOverflowError(f"{url}: {message}")
        raise BackendAnswerError(f"{url} answered HTTP {status}: {message}")

    def _usable(self, server: int, body: bytes, request: GenerationRequest) -> Generation:
        """The generation in a server's HTTP 200 answer. One that cannot be used counts as the server's
        error and takes it out of routing for `down_for_s` (it answers, but not with what a rollout needs)."""
        try:
            try:
                data = orjson.loads(body)
            except orjson.JSONDecodeError:
                raise _RetryableAnswer(f"answer is not JSON: {preview(body)}") from None
            generation = parse_completion(data, request=request, vocab_size=self.vocab_size)
        except (_RetryableAnswer, MalformedAnswerError) as error:
            self.router.finished(server, ok=False, down=True)
            raise _RetryableAnswer(str(error)) from None
        except BackendError as error:
            self.router.finished(server, ok=False, down=True)
            raise BackendAnswerError(f"{self.base_urls[server]}: {error}") from None
        self.router.finished(server, ok=True)
        return generation

    def _backoff_s(self, attempt: int, retry_after_s: float | None) -> float:
        delay_s = min(self.max_backoff_s, self.backoff_s * 2.0 ** (attempt - 1))
        delay_s *= 0.5 + 0.5 * self._rng.random()
        if retry_after_s is not None:
            delay_s = max(delay_s, min(retry_after_s, self.max_backoff_s))
        return delay_s

    async def aclose(self) -> None:
        """Close the running loop's connection pool; a later call opens a new one."""
        await self.http.aclose()

    def close(self) -> None:
        """Forget every connection pool (inside an event loop, `aclose` closes its pool cleanly; `asyncio.run`
        closes a forgotten one when its loop ends)."""
        self.http.close()
