"""One asyncio event loop on a daemon thread, for adapters whose trainer calls them synchronously.

The TRL rollout function and the NeMo RL environment's `step` are plain calls; the rollouts they
start run on this loop, so policies that hold connections or batching workers stay bound to one
loop, and the caller may itself be inside a running loop (notebooks).
"""

from __future__ import annotations

import asyncio
import atexit
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

_T = TypeVar("_T")


class LoopThread:
    """One event loop on a daemon thread for all rollouts of this process.

    Policies that hold connections (HTTP clients, batching workers) stay bound to one loop,
    and the caller may itself be inside a running loop (notebooks).
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                self._loop = asyncio.new_event_loop()
                ready = threading.Event()
                self._thread = threading.Thread(target=self._serve, args=(self._loop, ready), name="gym_bridge_loop", daemon=True)
                self._thread.start()
                ready.wait()
                atexit.register(self.close)
            loop = self._loop
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result()

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        """Start `coroutine` on the loop without waiting for it (dropped if the loop is gone)."""
        with self._lock:
            loop = self._loop
        if loop is None or loop.is_closed():
            coroutine.close()
        else:
            asyncio.run_coroutine_threadsafe(coroutine, loop)

    def close(self) -> None:
        """Cancel what still runs on the loop (batching workers) and stop it."""
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is None or loop.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(_cancel_others(), loop).result(timeout=5)
        except Exception:  # shutting down: nothing left to report to
            pass
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)

    @staticmethod
    def _serve(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        loop.run_forever()
        loop.close()


async def _cancel_others() -> None:
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
