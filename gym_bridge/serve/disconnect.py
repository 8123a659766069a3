"""What gym_bridge's two HTTP servers (`serve-model`, `serve`) share beneath their framework: a request's
work runs until it is done or the client disconnects, whichever comes first; then the work is cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from gym_bridge.core.errors import RolloutError

_T = TypeVar("_T")


class ClientDisconnected(RolloutError):
    """The client went away before its request's work finished; the work was cancelled."""


async def unless_disconnected(work: Awaitable[_T], receive: Callable[[], Awaitable[Mapping[str, Any]]], *,
                              on_cancel: Callable[[], None] | None = None) -> _T:
    """`await work`, cancelled as soon as the client disconnects (`receive`: the request's ASGI receive, its
    body already read, so only the disconnect message is left); then `on_cancel()` runs and ClientDisconnected
    is raised. The cancelled work's outcome is collected, so asyncio logs no unretrieved exception for it."""
    running = asyncio.ensure_future(work)
    watching = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({running, watching}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watching.cancel()
        stopped = not running.done()
        if stopped:  # the client went first (or this request was cancelled): the work may still be stopping
            running.cancel()
            running.add_done_callback(lambda done: done.cancelled() or done.exception())
            if on_cancel is not None:
                on_cancel()
    if stopped or running.cancelled():
        raise ClientDisconnected("the client disconnected; its work was cancelled")
    return running.result()


async def _disconnected(receive: Callable[[], Awaitable[Mapping[str, Any]]]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
