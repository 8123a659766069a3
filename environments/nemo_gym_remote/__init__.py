"""nemo_gym_remote: any NeMo Gym resources server as a gym_bridge environment, over HTTP.

Per rollout, as NeMo Gym's simple agent does: `POST /seed_session` with the row, then each tool
call the model makes as `POST /<tool name>` with its arguments, then `POST /verify` with the row
plus the Responses object of the trajectory; the server's session cookie rides along on every
call. The tools are the row's own schemas. With `session_protocol = "typed"` (NeMo Gym >= 0.7)
the session is seeded by id and closed with `POST /close_session` on every path. Connections
are pooled, every request has a timeout, answers are read up to `max_response_bytes` and decoded
in a worker thread when large, transport errors are retried a bounded number of times (a tool
call only when it never reached the server), and a server that is down, answers garbage or
answers too much fails the rollout as `env`. Route rows here with `agent_ref.remote` (the
server's URL) or `gym-bridge eval --env-url NAME=URL`.
"""

from __future__ import annotations

import asyncio
import http.cookiejar
import json
import math
import time
import uuid
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, TypeVar

import httpx

from gym_bridge import TOKEN_FIELDS, Environment, Item, RolloutError, FailRollout, Task, VerifyResult, get_environment, known_environments, register, remote_url

NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
"""Transport errors raised before a request reached the server: safe to retry even for a tool."""
OFF_LOOP_BYTES = 1 << 20
"""Answers at least this long are decoded and parsed in a worker thread."""
T = TypeVar("T")


class RemoteError(RolloutError):
    """The resources server could not be reached or answered something unusable."""

    failure_kind = "env"


class NemoGymRemoteEnvironment(Environment):
    name = "nemo_gym_remote"
    description = "Any NeMo Gym resources server over HTTP (seed_session, tool routes, verify); the row's tools, the server's reward."
    example_data = Path(__file__).parent / "data" / "example.jsonl"
    resume = "replay"  # a fresh server session (seed_session) gets the logged calls again; each output is checked
    tools_from_row = True
    settings = ("base_url", "request_timeout_s", "max_retries", "session_protocol", "max_connections", "max_response_bytes")
    tool_timeout_s: ClassVar[float] = 120.0
    verify_timeout_s: ClassVar[float] = 300.0
    base_url: ClassVar[str | None] = None
    """The server for rows without `agent_ref.remote`."""
    request_timeout_s: ClassVar[float] = 30.0
    """Bound on each HTTP request (connecting within min(5 s, this))."""
    max_retries: ClassVar[int] = 2
    session_protocol: ClassVar[str] = "legacy"
    """`legacy`: seed with the row (every NeMo Gym server); `typed`: seed by session id and close it (NeMo Gym >= 0.7)."""
    max_connections: ClassVar[int] = 256
    max_response_bytes: ClassVar[int] = 16 << 20
    """Bytes of one answer read at most; a longer one fails the rollout as `env` (16 MiB)."""
    transport: ClassVar[httpx.AsyncBaseTransport | None] = None
    """Replaces the network (tests pass `httpx.MockTransport`)."""

    @classmethod
    def bind(cls, name: str, base_url: str) -> type[NemoGymRemoteEnvironment]:
        """Register `name` as the resources server at `base_url` (what `--env-url NAME=URL` does).

        Rows routed to `name` then run remotely; the example data of a local environment of that
        name is kept, so `--env weather --env-url weather=URL` runs weather's rows on the server.
        """
        known_environments()  # load the entry points first, so the binding replaces them
        try:
            replaced: type[Environment] | None = get_environment(name)
        except Exception:
            replaced = None
        example = replaced.example_data if replaced is not None else None
        attrs = {
            "name": name, "aliases": (), "base_url": base_url.rstrip("/"), "example_data": example if name != cls.name else cls.example_data,
            "description": f"{name} on the NeMo Gym resources server at {base_url}", "__module__": cls.__module__,
        }
        return register(type(f"Remote_{name}", (cls,), attrs))  # type: ignore[return-value]

    # -- the session -------------------------------------------------------------------------

    async def setup(self, task: Task) -> None:
        url = remote_url(task.row) or self.base_url
        if not url:
            raise FailRollout("env", f"{task.source}: no resources server for {task.env_name!r}: add agent_ref.remote to the row or pass --env-url {task.env_name}=URL")
        self.url = url.rstrip("/")
        self.cookies: dict[str, str] = {}
        self.session_id = f"gb-{uuid.uuid4().hex}"
        self.task = task
        self.seeded = False
        if self.session_protocol not in ("legacy", "typed"):
            raise FailRollout("env", f"session_protocol must be 'legacy' or 'typed', got {self.session_protocol!r}")
        if self.session_protocol == "typed":
            body: dict[str, Any] = {
                "resources_session_id": self.session_id, "episode_id": {"rollout_id": self.session_id, "attempt": 0},
                "task_id": {"taskset": f"gym_bridge:{task.env_name}", "task_id": str(task.index)}, "task_data": request_row(task),
            }
        else:
            body = request_row(task)
        try:
            await self._json("/seed_session", body, idempotent=True)
        except RemoteError as error:
            raise FailRollout("env", f"seed_session: {error}") from None
        self.seeded = True

    async def call_row_tool(self, tool_name: str, /, **arguments: Any) -> str:
        """POST the arguments to the tool's route; the body of a 2xx or 4xx answer is what the model reads."""
        response = await self._post(f"/{tool_name}", arguments, idempotent=False)
        if response.status_code >= 500:
            raise RemoteError(f"{self.url}/{tool_name} answered {response.status_code}: {response.head(300)}")
        return await response.text()

    async def verify(self, task: Task, output: list[Item]) -> VerifyResult:
        body = {**request_row(task), "response": response_object(task, output)}
        try:
            answer = await self._json("/verify", body, idempotent=True)
            reward = answer.get("reward")
            if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
                raise RemoteError(f"/verify answered without a finite `reward`: {json.dumps(answer)[:300]}")
        except RemoteError as error:
            return VerifyResult(reward=0.0, mask_sample=True, failure_kind="env", failure_reason=f"verify: {error}")
        metrics = {
            key: value for key, value in answer.items()
            if key not in body and key not in ("reward", "mask_sample") and value is not None and _scalar(value)
        }
        if answer.get("mask_sample"):
            reason = f"the resources server masked the sample ({answer.get('failure_kind')}): {answer.get('failure_reason')}"
            return VerifyResult(reward=0.0, mask_sample=True, failure_kind="verifier", failure_reason=reason, metrics=metrics)
        return VerifyResult(reward=float(reward), metrics=metrics)

    async def close(self) -> None:
        """Close the server's session (typed protocol) and forget its cookie; runs on every path."""
        try:
            if getattr(self, "seeded", False) and self.session_protocol == "typed":
                body = {"resources_session_id": self.session_id, "episode_id": {"rollout_id": self.session_id, "attempt": 0}}
                await self._json("/close_session", body, idempotent=True)
        finally:
            getattr(self, "cookies", {}).clear()

    # -- HTTP ------------------------------------------------------------------------------------

    async def _json(self, path: str, body: dict[str, Any], *, idempotent: bool) -> dict[str, Any]:
        response = await self._post(path, body, idempotent=idempotent)
        if response.status_code >= 400:
            raise RemoteError(f"{self.url}{path} answered {response.status_code}: {response.head(300)}")
        try:
            answer = await response.json()
        except ValueError:
            raise RemoteError(f"{self.url}{path} answered {response.status_code} with a body that is not JSON: {response.head(200)!r}") from None
        if not isinstance(answer, dict):
            raise RemoteError(f"{self.url}{path} answered JSON that is not an object: {response.head(200)!r}")
        return answer

    async def _post(self, path: str, body: dict[str, Any], *, idempotent: bool) -> Answer:
        """One POST with the session cookie, retried on transport errors: any of them when the call is
        idempotent, else only those raised before the request was sent. Raises RemoteError, also for
        an answer longer than `max_response_bytes` (never read past it)."""
        client = _client(type(self))
        retryable = httpx.TransportError if idempotent else NOT_SENT
        for attempt in range(self.max_retries + 1):
            try:
                headers = {"Cookie": "; ".join(f"{name}={value}" for name, value in self.cookies.items())} if self.cookies else {}
                async with client.stream("POST", self.url + path, json=body, headers=headers) as response:
                    content = await _read_capped(response, self.max_response_bytes, f"{self.url}{path}")
            except retryable as error:
                if attempt == self.max_retries:
                    raise RemoteError(f"{self.url}{path}: {type(error).__name__}: {error or 'no answer'} (after {attempt + 1} attempts)") from None
                await asyncio.sleep(min(2.0, 0.1 * 2**attempt))
                continue
            except httpx.HTTPError as error:
                raise RemoteError(f"{self.url}{path}: {type(error).__name__}: {error or 'no answer'}") from None
            for cookie in response.cookies.jar:
                if cookie.value is not None:
                    self.cookies[cookie.name] = cookie.value
            return Answer(status_code=response.status_code, content=content, encoding=response.encoding or "utf-8")
        raise AssertionError("unreachable")


@dataclass(frozen=True)
class Answer:
    """A resources server's answer, read whole (at most `max_response_bytes`)."""

    status_code: int
    content: bytes
    encoding: str

    def head(self, chars: int) -> str:
        """The first `chars` characters of the body, for error messages."""
        return self.content[: chars * 4].decode(self.encoding, errors="replace")[:chars]

    async def text(self) -> str:
        """The body as text, decoded in a worker thread when long."""
        return await _off_loop_if_long(self.content, lambda: self.content.decode(self.encoding, errors="replace"))

    async def json(self) -> Any:
        """The body parsed as JSON, in a worker thread when long; raises ValueError when it is not JSON."""
        return await _off_loop_if_long(self.content, lambda: json.loads(self.content))


async def _off_loop_if_long(content: bytes, work: Callable[[], T]) -> T:
    """`work()`, in a worker thread when `content` is long."""
    if len(content) < OFF_LOOP_BYTES:
        return work()
    return await asyncio.to_thread(work)


async def _read_capped(response: httpx.Response, max_bytes: int, where: str) -> bytes:
    """The body of a streamed `response`, refusing (RemoteError) one longer than `max_bytes`
    before reading past it: by its Content-Length, else as the bytes arrive."""
    declared = response.headers.get("content-length")
    too_long = f"{where} answered more than max_response_bytes ({max_bytes:,} bytes)"
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise RemoteError(f"{too_long}: Content-Length {int(declared):,}")
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > max_bytes:
            raise RemoteError(too_long)
    return bytes(body)


def request_row(task: Task) -> dict[str, Any]:
    """The row as NeMo Gym's run request: its fields, with `responses_create_params` made from the
    prompt when the row gave `messages` or `prompt` instead."""
    if task.row.get("responses_create_params"):
        return dict(task.row)
    params: dict[str, Any] = {"input": [{"role": message["role"], "content": message["content"]} for message in task.messages]}
    if task.tools:
        params["tools"] = list(task.tools)
    return {**task.row, "responses_create_params": params}


def response_object(task: Task, output: list[Item]) -> dict[str, Any]:
    """The trajectory as the Responses object `/verify` takes (token fields left out)."""
    params = task.create_params
    return {
        "id": f"resp_{uuid.uuid4().hex}", "object": "response", "created_at": int(time.time()), "model": str(params.get("model") or "gym_bridge"),
        "status": "completed", "output": [{key: value for key, value in item.items() if key not in TOKEN_FIELDS} for item in output],
        "parallel_tool_calls": bool(params.get("parallel_tool_calls", True)), "tool_choice": params.get("tool_choice", "auto"),
        "tools": list(task.tools or []),
    }


def _scalar(value: Any) -> bool:
    return isinstance(value, (bool, int, float, str))


class _NoCookieJar(http.cookiejar.CookieJar):
    """The shared client keeps no cookies: each rollout carries its own session cookie."""

    def extract_cookies(self, response: Any, request: Any) -> None:
        return None

    def set_cookie(self, cookie: http.cookiejar.Cookie) -> None:
        return None


_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple, httpx.AsyncClient]] = weakref.WeakKeyDictionary()


def _client(env_class: type[NemoGymRemoteEnvironment]) -> httpx.AsyncClient:
    """The pooled client of this event loop for these settings."""
    loop = asyncio.get_running_loop()
    key = (env_class.request_timeout_s, env_class.max_connections, id(env_class.transport))
    clients = _clients.setdefault(loop, {})
    if key not in clients:
        timeout = httpx.Timeout(env_class.request_timeout_s, connect=min(5.0, env_class.request_timeout_s))
        limits = httpx.Limits(max_connections=env_class.max_connections, max_keepalive_connections=min(64, env_class.max_connections))
        clients[key] = httpx.AsyncClient(timeout=timeout, limits=limits, cookies=_NoCookieJar(), transport=env_class.transport)
    return clients[key]
