"""The HTTP transport of the remote policies: one aiohttp client, its answers and its transport errors.

`HttpClient` keeps one keep-alive pool per event loop (bounded in all and per server) and posts
bytes; `request_once` is a throwaway connection for start-up probes. Both say what happened as an
`HttpAnswer` or a `TransportError` that tells whether the request may have reached the server, so
the policy above decides what to retry. Tests swap the network for an httpx transport.
"""

from __future__ import annotations

import asyncio
import re
import weakref
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import aiohttp
import orjson
from yarl import URL

from gym_bridge.core.dialects.completions import preview
from gym_bridge.core.errors import BackendError

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
JSON_HEADERS = {"Content-Type": "application/json"}


@dataclass(frozen=True)
class HttpAnswer:
    """What a server answered to one request."""

    status: int
    body: bytes
    retry_after: str | None = None
    """The `Retry-After` header, if any."""


class TransportError(BackendError):
    """No answer: the connection failed, broke or was refused (the callers here turn it into one of the errors below)."""

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


def retry_after_s(value: str | None) -> float | None:
    """A `Retry-After` header in seconds (None when absent or not a number of seconds)."""
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


async def request_once(method: str, url: str, *, body: Any = None, api_key: str | None, timeout_s: float) -> HttpAnswer:
    """One request on a throwaway connection (start-up probes such as `/models`); raises `TransportError`."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with asyncio.timeout(timeout_s):
            connector = aiohttp.TCPConnector(ssl=_ssl_setting([url]))
            async with aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar()) as session:
                data = orjson.dumps(body) if body is not None else None
                async with session.request(method, url, data=data, headers={**headers, **JSON_HEADERS}) as response:
                    return HttpAnswer(status=response.status, body=await response.read())
    except TimeoutError:
        raise TransportError(f"no answer within {timeout_s:g} s", reached=True) from None
    except (aiohttp.ClientError, OSError) as error:
        refused = isinstance(getattr(error, "os_error", error), ConnectionRefusedError)
        raise TransportError(_describe(error), reached=not _never_sent(error), refused=refused) from None


class _Pool:
    """An aiohttp session (its keep-alive connections) tied to one event loop.

    The session is closed by `HttpClient.aclose`, or, when a loop ends without it, by the loop's
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


class HttpClient:
    """POSTs bodies over keep-alive connections: one pool per event loop, so one client serves every loop
    it is awaited from (a trainer's threads, `asyncio.run` per batch).

    `max_connections` bounds the pooled connections in all, `max_connections_per_server` those to one
    server; requests beyond wait for a free one. `transport` replaces the network with an httpx
    transport (tests pass `httpx.MockTransport`).
    """

    def __init__(self, urls: Sequence[str], *, api_key: str | None = None, max_connections: int = 1024,
                 max_connections_per_server: int | None = None, connect_timeout_s: float = 10.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.max_connections = max_connections
        self.max_connections_per_server = max_connections_per_server or max_connections
        self.connect_timeout_s = connect_timeout_s
        self._ssl = _ssl_setting(urls)
        self._transport = transport
        self._headers = {**JSON_HEADERS, **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pool] = weakref.WeakKeyDictionary()

    async def post(self, url: URL, body: bytes) -> HttpAnswer:
        """POST `body` to `url`; raises `TransportError` when no answer comes (saying whether the request
        had been sent)."""
        if self._transport is not None:
            return await self._post_through_transport(url, body)
        session = (await self._pool()).session
        try:
            async with session.post(url, data=body, headers=self._headers) as response:
                return HttpAnswer(status=response.status, body=await response.read(), retry_after=response.headers.get("Retry-After"))
        except (aiohttp.ClientError, OSError) as error:
            raise TransportError(_describe(error), reached=not _never_sent(error)) from None

    async def _post_through_transport(self, url: URL, body: bytes) -> HttpAnswer:
        import httpx

        assert self._transport is not None
        request = httpx.Request("POST", str(url), content=body, headers=self._headers)
        try:
            response = await self._transport.handle_async_request(request)
            content = await response.aread()
        except httpx.TransportError as error:
            never_sent = isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout))
            raise TransportError(_describe(error), reached=not never_sent) from None
        return HttpAnswer(status=response.status_code, body=content, retry_after=response.headers.get("retry-after"))

    async def _pool(self) -> _Pool:
        """The connection pool of the running event loop (each loop gets its own)."""
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            for stale in [other for other in self._pools if other.is_closed()]:
                del self._pools[stale]
            connector = aiohttp.TCPConnector(
                limit=self.max_connections, limit_per_host=self.max_connections_per_server, keepalive_timeout=KEEPALIVE_S,
                ttl_dns_cache=60, ssl=self._ssl,
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
