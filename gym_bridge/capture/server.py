"""The capture endpoint: an OpenAI-compatible `/v1/chat/completions` on loopback, one server per
event loop, routing each request to its rollout's `CaptureSession`.

A session is named in the URL (`http://127.0.0.1:PORT/s/<token>/v1`) or by the API key (the
same token, for harnesses that only let you set `OPENAI_API_KEY` with a fixed base URL). Errors
use OpenAI's shape (`{"error": {message, type, param, code}}`) and status codes: 400 for what
the endpoint cannot serve, 401 for an unknown key, 404 for an unknown model or session.
The server starts with the first open session and stops when the last one closes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from gym_bridge.capture.chat_session import ChatCaptureSession
from gym_bridge.capture.session import CaptureSession
from gym_bridge.core.dialects.chat import ApiError

MAX_REQUEST_BYTES = 16 * 1024 * 1024


def _error(error: ApiError) -> web.Response:
    body = {"error": {"message": error.message, "type": error.kind, "param": None, "code": error.code}}
    return web.json_response(body, status=error.status)


class CaptureServer:
    """The loopback HTTP server of one event loop; `session(...)` opens a rollout's session on it."""

    def __init__(self) -> None:
        self.sessions: dict[str, CaptureSession | ChatCaptureSession] = {}
        self.port: int | None = None
        self._runner: web.AppRunner | None = None
        self._lock = asyncio.Lock()

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        app.router.add_post("/s/{token}/v1/chat/completions", self._chat)
        app.router.add_get("/s/{token}/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
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
    async def session(self, session: CaptureSession | ChatCaptureSession) -> AsyncIterator[str]:
        """Serve `session` while the block runs; yields its base URL (`.../s/<token>/v1`)."""
        async with self._lock:
            if self._runner is None:
                await self._start()
            self.sessions[session.token] = session
        try:
            yield f"http://127.0.0.1:{self.port}/s/{session.token}/v1"
        finally:
            async with self._lock:
                self.sessions.pop(session.token, None)
                if not self.sessions:
                    await self._stop()

    def _find(self, request: web.Request) -> CaptureSession | ChatCaptureSession:
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

    async def _chat(self, request: web.Request) -> web.Response:
        try:
            session = self._find(request)
            try:
                data = json.loads(await request.read())
            except (UnicodeDecodeError, json.JSONDecodeError) as error:
                raise session.fail(400, f"request body is not valid JSON: {error}") from None
            return web.json_response(await session.chat_completions(data))
        except ApiError as error:
            return _error(error)
        except web.HTTPException:
            raise
        except Exception as error:  # one request fails, the server and the other sessions go on
            return _error(ApiError(500, f"{type(error).__name__}: {error}", "server_error"))

    async def _models(self, request: web.Request) -> web.Response:
        try:
            session = self._find(request)
        except ApiError as error:
            return _error(error)
        entry: dict[str, Any] = {"id": session.model_name, "object": "model", "created": 0, "owned_by": "gym_bridge"}
        return web.json_response({"object": "list", "data": [entry]})


_servers: dict[asyncio.AbstractEventLoop, CaptureServer] = {}


def capture_server() -> CaptureServer:
    """The capture server of the running event loop (created on first use, started with its first session)."""
    loop = asyncio.get_running_loop()
    for stale in [other for other in _servers if other.is_closed()]:
        del _servers[stale]
    return _servers.setdefault(loop, CaptureServer())
