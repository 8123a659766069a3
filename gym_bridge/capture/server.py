"""The capture endpoint: an OpenAI-compatible `/v1/chat/completions` and `/v1/responses` on
loopback, one server per event loop, routing each request to its rollout's capture session (`SessionState`).

`stream: true` is answered as Server-Sent Events once the whole generation is in (the policy
returns whole generations): the answer's `chat.completion.chunk`s ending with `data: [DONE]`, or
the Responses API's named events ending with `response.completed`. What is captured does not
depend on streaming; an error found before generating is an ordinary JSON error answer.

A session is named in the URL (`http://127.0.0.1:PORT/s/<token>/v1`) or by the API key (the
same token, for harnesses that only let you set `OPENAI_API_KEY` with a fixed base URL). Errors
use OpenAI's shape (`{"error": {message, type, param, code}}`) and status codes: 400 for what
the endpoint cannot serve (a body that is not JSON or nests too deeply: `gym_bridge.core.request_body`),
401 for an unknown key, 404 for an unknown model or session, 413 for a body over 16 MiB, 415 for a
body sent as anything but JSON (`text/plain` or a form: what a browser page may send cross-site
without asking; no OpenAI client sends one).
The server starts with the first open session and stops when the last one closes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from gym_bridge.capture.session import SessionState
from gym_bridge.core.dialects.chat import ApiError, completion_chunks
from gym_bridge.core.dialects.responses_api import response_events
from gym_bridge.core.request_body import BodyError, json_object, read_json

MAX_REQUEST_BYTES = 16 * 1024 * 1024


def _error(error: ApiError) -> web.Response:
    body = {"error": {"message": error.message, "type": error.kind, "param": None, "code": error.code}}
    return web.json_response(body, status=error.status)


class CaptureServer:
    """The loopback HTTP server of one event loop; `session(...)` opens a rollout's session on it."""

    def __init__(self) -> None:
        self.sessions: dict[str, SessionState] = {}
        self.port: int | None = None
        self._runner: web.AppRunner | None = None
        self._lock = asyncio.Lock()

    def _app(self) -> web.Application:
        app = web.Application()  # the body is read as it streams in, its size bounded by `read_json`
        for root in ("/s/{token}/v1", "/v1"):
            app.router.add_post(f"{root}/chat/completions", self._chat)
            app.router.add_post(f"{root}/responses", self._responses)
            app.router.add_get(f"{root}/models", self._models)
        return app

    async def _start(self) -> None:
        runner = web.AppRunner(self._app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self._runner = runner
        self.port = runner.addresses[0][1]

    async def _stop(self) -> None:
        runner, self._runner, self.port = self._runner, None, None
        if runner is not None:
            await runner.cleanup()

    @asynccontextmanager
    async def session(self, session: SessionState) -> AsyncIterator[str]:
        """Serve `session` while the block runs; yields its base URL (`.../s/<token>/v1`)."""
        async with self._lock:
            if self._runner is None:
                await self._start()
            self.sessions[session.ledger.token] = session
        try:
            yield f"http://127.0.0.1:{self.port}/s/{session.ledger.token}/v1"
        finally:
            async with self._lock:
                self.sessions.pop(session.ledger.token, None)
                await session.ledger.close()  # no generation outlives its rollout
                if not self.sessions:
                    await self._stop()

    def _find(self, request: web.Request) -> SessionState:
        token = request.match_info.get("token")
        if token is not None:
            found = self.sessions.get(token)
            if found is None:
                raise ApiError(404, f"no capture session {token!r} (the rollout is over or the URL is wrong)", "invalid_request_error")
            return found
        key = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        found = self.sessions.get(key)
        if found is None:
            raise ApiError(401, "Incorrect API key provided: use the rollout's OPENAI_API_KEY", "invalid_request_error")
        return found

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        async def answer(session: SessionState, data: Any) -> web.StreamResponse:
            completion = await session.chat_completions(data)
            if data.get("stream") is not True:  # the body validated it as a JSON true or false
                return web.json_response(completion)
            include_usage = bool((data.get("stream_options") or {}).get("include_usage"))
            events = [(None, chunk) for chunk in completion_chunks(completion, include_usage=include_usage)]
            return await _event_stream(request, events, done=True)

        return await self._serve(request, answer)

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        async def answer(session: SessionState, data: Any) -> web.StreamResponse:
            response = await session.ledger.responses(data, session.chat_completions)
            if data.get("stream") is not True:  # the body validated it as a JSON true or false
                return web.json_response(response)
            return await _event_stream(request, [(event["type"], event) for event in response_events(response)], done=False)

        return await self._serve(request, answer)

    async def _serve(self, request: web.Request,
                     answer: Callable[[SessionState, Any], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        """Find the session, read the JSON body and answer it; every failure is an error answer in OpenAI's shape."""
        try:
            session = self._find(request)
            if not _is_json(request.headers.get("Content-Type")):
                raise session.ledger.fail(415, f"Content-Type {request.headers['Content-Type']!r} is not supported: send the body as JSON "
                                        "with Content-Type: application/json", code="unsupported_media_type")
            try:
                data = json_object(await read_json(request.content.iter_any(), content_length=request.headers.get("Content-Length"),
                                                   max_bytes=MAX_REQUEST_BYTES))
            except BodyError as error:
                raise session.ledger.fail(error.status, error.message) from None
            try:
                return await answer(session, data)
            except RecursionError:  # JSON in a string field (tool call arguments) nested as deep
                raise session.ledger.fail(400, "request is nested too deeply to parse") from None
        except ApiError as error:
            return _error(error)
        except Exception as error:  # one request fails, the server and the other sessions go on
            return _error(ApiError(500, f"{type(error).__name__}: {error}", "server_error"))

    async def _models(self, request: web.Request) -> web.Response:
        try:
            session = self._find(request)
        except ApiError as error:
            return _error(error)
        entry: dict[str, Any] = {"id": session.ledger.model_name, "object": "model", "created": 0, "owned_by": "gym_bridge"}
        return web.json_response({"object": "list", "data": [entry]})


def _is_json(content_type: str | None) -> bool:
    """Whether a request's Content-Type is JSON (`application/json`, `application/*+json`, any
    parameters); a request without one is read as JSON too, as FastAPI (vLLM's server) does."""
    if content_type is None:
        return True
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


async def _event_stream(request: web.Request, events: Iterable[tuple[str | None, dict[str, Any]]], *,
                        done: bool) -> web.StreamResponse:
    """Server-Sent Events: one `data:` line per event (after its `event:` name when it has one),
    then `data: [DONE]` when `done` (chat completions end so, the Responses API does not). A client
    that hangs up mid-stream ends it (the call is captured already)."""
    stream = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await stream.prepare(request)
    lines = [f"event: {name}\ndata: {json.dumps(payload)}\n\n" if name else f"data: {json.dumps(payload)}\n\n"
             for name, payload in events]
    try:
        for line in [*lines, "data: [DONE]\n\n"] if done else lines:
            await stream.write(line.encode())
        await stream.write_eof()
    except ConnectionResetError:
        pass
    return stream


_servers: dict[asyncio.AbstractEventLoop, CaptureServer] = {}


def capture_server() -> CaptureServer:
    """The capture server of the running event loop (created on first use, started with its first session)."""
    loop = asyncio.get_running_loop()
    for stale in [other for other in _servers if other.is_closed()]:
        del _servers[stale]
    return _servers.setdefault(loop, CaptureServer())
