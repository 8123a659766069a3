"""What gym_bridge's two HTTP servers (`serve-model`, `serve`) share to bound their work: a limit on
the requests in flight, enforced inside the app, on the routes that do the work only.

uvicorn's own `limit_concurrency` counts open connections (idle keep-alive ones too) and answers
every route past it with a 503, `/health` included: a liveness probe then restarts a busy, healthy
server, and a burst just over the limit is refused almost whole (its connections are all open before
the first request is read). `RequestLimit` wraps the ASGI app instead: past `limit` requests in
flight on a limited route, a request gets a 503 with `Retry-After` at once (only those past it);
every other route, `/health` among them, is always served.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

RETRY_AFTER_S = 1
"""What a refused request's `Retry-After` says (seconds)."""


class RequestLimit:
    """An ASGI app: `app`, with at most `limit` requests in flight on the paths `limited(path)` is
    true of; a request past it is answered 503 with the JSON `refusal(limit)` and `Retry-After`."""

    def __init__(self, app: App, *, limit: int, limited: Callable[[str], bool], refusal: Callable[[int], dict[str, Any]]) -> None:
        if limit < 1:
            raise ValueError(f"the request limit must be at least 1, got {limit}")
        self.app, self.limit, self.limited, self.refusal = app, limit, limited, refusal
        self.in_flight = 0
        """Requests on limited paths being served now."""
        self.refused = 0
        """Requests answered 503 so far."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.limited(scope["path"]):
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            self.refused += 1
            await _refuse(send, json.dumps(self.refusal(self.limit)).encode())
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


async def _refuse(send: Send, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"retry-after", str(RETRY_AFTER_S).encode())]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})
