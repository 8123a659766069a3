"""A `Policy` over OpenAI-compatible servers (`vllm serve`, `trl vllm-serve`, `gym-bridge serve-model`).

Each call is one `POST {base_url}/completions` whose prompt is the token ids, with log-probs of the
sampled tokens only (`logprobs: 0`) and `return_tokens_as_token_ids`, so the sampled ids arrive as
the `"token_id:N"` strings of the log-probs (or as `token_ids` where a server sends them). The
first call of each rollout also asks for `return_token_ids` and checks that the server's echo of
the prompt is the prompt sent; later calls skip the echo, whose size grows with the conversation.
All calls of one rollout (`GenerationRequest.session_id`) go to the same server, so its prefix
cache is reused; new rollouts go to the least busy server, and a server that stops answering is
skipped for `down_for_s` while its rollouts move to the next one.

HTTP is aiohttp with keep-alive pools (one per event loop, bounded in all and per server) and
orjson; measured against httpx, it costs about a tenth of the CPU per request
(benchmarks/remote_throughput.py). Every attempt is bounded by `request_timeout_s`. A call that
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
import re
import time
import weakref
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import aiohttp
import orjson
from yarl import URL

from gym_bridge.core.dialects.completions import MalformedAnswerError, parse_completion, preview, request_fields
from gym_bridge.core.policy import BackendError, ContextOverflowError, Generation, GenerationRequest, SamplingParams
from gym_bridge.policies.router import ReplicaRouter
from gym_bridge.core.errors import BackendAnswerError

if TYPE_CHECKING:
    import httpx

CONTEXT_OVERFLOW_PATTERN = re.compile(
    r"maximum context length|maximum model length|max_model_len|context length|context window|context_length_exceeded"
    r"|prompt is too long|is too long and exceeds",
    re.IGNORECASE,
)
"""What vLLM, OpenAI and serve-model say (with status 400) when a prompt does not fit."""

KEEPALIVE_S = 4.0
"""Idle pooled connections are closed after this long: below uvicorn's 5 s default (vLLM's server),
so the client never reuses a connection the server is closing."""
_JSON_HEADERS = {"Content-Type": "application/json"}


class _RetryableAnswer(Exception):
    """The server answered, but with something to retry (5xx, 429, a malformed body)."""

    def __init__(self, reason: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class HttpAnswer:
    """What a server answered to one request."""

    status: int
    body: bytes
    retry_after: str | None = None
    """The `Retry-After` header, if any."""


class _TransportError(Exception):
    """No answer: the connection failed, broke or was refused."""

    def __init__(self, reason: str, *, reached: bool, refused: bool = False) -> None:
        super().__init__(reason)
        self.reached = reached
        """The connection broke after the request was sent, so the server may have started on it."""
        self.refused = refused
        """The host refused the connection: nothing listens on the port (yet)."""


class ServerUnreachableError(BackendError):
    """No server answers at the URL (connection refused, unknown host, no answer at all)."""

    refused: bool = False
    """Nothing listens on the port (yet): a server that is still starting looks like this."""


class ReplicaLostError(BackendError):
    """The connection broke after the request was sent: the server died or dropped it mid-answer (not
    retried unless `retry_reached_calls`: the server may have generated, and a resend samples anew)."""


class RequestTimeoutError(BackendError):
    """A request got no answer within `request_timeout_s` (not retried: the server may still be generating)."""


def normalize_base_url(url: str) -> str:
    """`http://host:port` or `http://host:port/v1/` -> `http://host:port/v1` (a bare host gets `/v1`)."""
    url = url.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"base URL {url!r} is not an http(s) URL such as http://127.0.0.1:8000/v1")
    return url if parts.path not in ("", "/") else url + "/v1"


def error_message(answer: HttpAnswer) -> str:
    """The message of an error answer (OpenAI/vLLM `{"error": {"message"}}`, `{"message"}`, FastAPI `{"detail"}`)."""
    try:
        data = orjson.loads(answer.body)
    except orjson.JSONDecodeError:
        return preview(answer.body) or f"HTTP {answer.status}"
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        for key in ("message", "detail", "error"):
            if data.get(key):
                return data[key] if isinstance(data[key], str) else preview(data[key])
    return preview(data)


def _retry_after_s(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _ssl_setting(urls: Sequence[str]) -> bool:
    """aiohttp's `ssl` argument: False for plain-http servers only, which spares building an SSL context
    (tens of milliseconds at start-up); True (verified TLS) as soon as one URL is https."""
    return any(url.startswith("https:") for url in urls)


def _describe(error: BaseException) -> str:
    """A transport error in words that do not depend on the HTTP library."""
    if isinstance(error, aiohttp.ClientConnectorError):
        return f"ConnectError: {error}"
    return f"{type(error).__name__}: {error}"


def _never_sent(error: BaseException) -> bool:
    """True for an aiohttp error that came before the request was sent: refused or reset while
    connecting, a connect timeout, an unknown host. Anything later (the server disconnected, a reset
    or a broken body after sending) may have reached the server. So does, conservatively, a pooled
    keep-alive connection the server closed just as the request was written (rare: `KEEPALIVE_S` is
    below servers' idle timeout, and a dead server's closed connections leave the pool)."""
    return isinstance(error, (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError))


async def _request_once(method: str, url: str, *, body: Any = None, api_key: str | None, timeout_s: float) -> HttpAnswer:
    """One request on a throwaway connection (start-up probes such as `/models`); raises `_TransportError`."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with asyncio.timeout(timeout_s):
            connector = aiohttp.TCPConnector(ssl=_ssl_setting([url]))
            async with aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar()) as session:
                data = orjson.dumps(body) if body is not None else None
                async with session.request(method, url, data=data, headers={**headers, **_JSON_HEADERS}) as response:
                    return HttpAnswer(status=response.status, body=await response.read())
    except TimeoutError:
        raise _TransportError(f"no answer within {timeout_s:g} s", reached=True) from None
    except (aiohttp.ClientError, OSError) as error:
        refused = isinstance(getattr(error, "os_error", error), ConnectionRefusedError)
        raise _TransportError(_describe(error), reached=not _never_sent(error), refused=refused) from None


async def served_models(base_url: str, *, api_key: str | None = None, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The `data` of `GET {base_url}/models` (each has `id`; vLLM and serve-model add `root`, `max_model_len`).

    Raises `ServerUnreachableError` when no server answers, `BackendError` when it answers something else.
    """
    url = normalize_base_url(base_url) + "/models"
    try:
        answer = await _request_once("GET", url, api_key=api_key, timeout_s=timeout_s)
    except _TransportError as error:
        unreachable = ServerUnreachableError(f"cannot reach {url}: {error}")
        unreachable.refused = error.refused
        raise unreachable from None
    if answer.status != 200:
        raise BackendAnswerError(f"{url} answered {answer.status}: {error_message(answer)}")
    try:
        data = orjson.loads(answer.body)["data"]
        return [entry for entry in data if isinstance(entry, dict) and "id" in entry]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        raise BackendAnswerError(f"{url} answered something other than a model list: {preview(answer.body)}") from None


async def served_token_ids(base_url: str, text: str, *, model: str, api_key: str | None = None, timeout_s: float = 10.0) -> list[int] | None:
    """How the server tokenizes `text` (vLLM's and serve-model's `POST /tokenize`, no special tokens added);
    None when the server has no such endpoint or cannot be asked."""
    root = normalize_base_url(base_url).removesuffix("/v1")
    body = {"model": model, "prompt": text, "add_special_tokens": False}
    try:
        answer = await _request_once("POST", f"{root}/tokenize", body=body, api_key=api_key, timeout_s=timeout_s)
        tokens = orjson.loads(answer.body)["tokens"] if answer.status == 200 else None
    except (_TransportError, orjson.JSONDecodeError, KeyError, TypeError):
        return None
    return tokens if isinstance(tokens, list) else None


@dataclass(frozen=True)
class LoadedTokenizer:
    """A tokenizer to render prompts with, and the EOS ids (the tokenizer's plus `generation_config.json`'s)."""

    tokenizer: Any
    eos_token_ids: list[int]
    light: bool
    """Loaded without transformers (`gym_bridge.policies.tokenizer`)."""


def load_tokenizer(path: str, *, light: bool = True) -> LoadedTokenizer:
    """A local tokenizer folder's tokenizer.

    `light`: without transformers, which would import torch only to render prompts (seconds of
    start-up), when the folder has a `tokenizer.json`; else with transformers' `AutoTokenizer`.
    """
    from gym_bridge.policies.tokenizer import load_tokenizer as load_light

    if light and (Path(path) / "tokenizer.json").is_file():
        tokenizer = load_light(path)
        return LoadedTokenizer(tokenizer=tokenizer, eos_token_ids=tokenizer.eos_token_ids, light=True)
    from transformers import AutoTokenizer, GenerationConfig

    auto = AutoTokenizer.from_pretrained(path)
    eos = {auto.eos_token_id} if isinstance(auto.eos_token_id, int) else set()
    try:
        configured = GenerationConfig.from_pretrained(path).eos_token_id
    except (OSError, ValueError):
        configured = None
    eos.update([configured] if isinstance(configured, int) else (configured or []))
    return LoadedTokenizer(tokenizer=auto, eos_token_ids=sorted(eos), light=False)


class _Pool:
    """An aiohttp session (its keep-alive connections) tied to one event loop.

    The session is closed by `RemotePolicy.aclose`, or, when a loop ends without it, by the loop's
    own shutdown (`asyncio.run` closes every live async generator, and `_lifetime` is one).
    """

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session
        self._lifetime = self._live()

    async def _live(self) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            await self.session.close()

    async def start(self) -> None:
        await self._lifetime.asend(None)

    async def close(self) -> None:
        await self._lifetime.aclose()


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
        self._transport = transport
        self._headers = {**_JSON_HEADERS, **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
        self._urls = [URL(url + "/completions", encoded=True) for url in self.base_urls]
        self.router = ReplicaRouter(self.base_urls, down_for_s=down_for_s)
        """Which server each call goes to (episode affinity, least busy, failover); a session it knows has had its prompt echo checked."""
        self._heads: dict[tuple[SamplingParams, bool], bytes] = {}
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pool] = weakref.WeakKeyDictionary()

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
                answer = await self._post(server, body)
        except TimeoutError:
            self.router.finished(server, ok=False)
            raise RequestTimeoutError(
                f"{self.base_urls[server]}: request timed out after {self.request_timeout_s:g} s (no answer; not retried, since "
                "the server may still be generating and a retry would start over): raise the request timeout"
            ) from None
        except _TransportError as error:
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
            raise _RetryableAnswer(f"HTTP {status}: {message}", retry_after_s=_retry_after_s(answer.retry_after))
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

    async def _post(self, server: int, body: bytes) -> HttpAnswer:
        """POST `body` to a server's `/completions`; raises `_TransportError` when no answer comes (saying
        whether the request had been sent)."""
        if self._transport is not None:
            return await self._post_through_transport(server, body)
        session = (await self._pool()).session
        try:
            async with session.post(self._urls[server], data=body, headers=self._headers) as response:
                return HttpAnswer(status=response.status, body=await response.read(), retry_after=response.headers.get("Retry-After"))
        except (aiohttp.ClientError, OSError) as error:
            raise _TransportError(_describe(error), reached=not _never_sent(error)) from None

    async def _post_through_transport(self, server: int, body: bytes) -> HttpAnswer:
        import httpx

        assert self._transport is not None
        request = httpx.Request("POST", str(self._urls[server]), content=body, headers=self._headers)
        try:
            response = await self._transport.handle_async_request(request)
            content = await response.aread()
        except httpx.TransportError as error:
            never_sent = isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout))
            raise _TransportError(_describe(error), reached=not never_sent) from None
        return HttpAnswer(status=response.status_code, body=content, retry_after=response.headers.get("retry-after"))

    def _backoff_s(self, attempt: int, retry_after_s: float | None) -> float:
        delay_s = min(self.max_backoff_s, self.backoff_s * 2.0 ** (attempt - 1))
        delay_s *= 0.5 + 0.5 * self._rng.random()
        if retry_after_s is not None:
            delay_s = max(delay_s, min(retry_after_s, self.max_backoff_s))
        return delay_s

    async def _pool(self) -> _Pool:
        """The connection pool of the running event loop (each loop gets its own)."""
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            for stale in [other for other in self._pools if other.is_closed()]:
                del self._pools[stale]
            connector = aiohttp.TCPConnector(
                limit=self.max_connections, limit_per_host=self.max_connections_per_server, keepalive_timeout=KEEPALIVE_S,
                ttl_dns_cache=60, ssl=_ssl_setting(self.base_urls),
            )
            session = aiohttp.ClientSession(
                connector=connector, cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s),
            )
            pool = self._pools[loop] = _Pool(session)
            await pool.start()
        return pool

    async def aclose(self) -> None:
        """Close the running loop's connection pool; a later call opens a new one."""
        pool = self._pools.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            await pool.close()

    def close(self) -> None:
        """Forget every connection pool (inside an event loop, `aclose` closes its pool cleanly; `asyncio.run`
        closes a forgotten one when its loop ends)."""
        self._pools.clear()
