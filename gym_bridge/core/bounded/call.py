"""Environment code (setup, tools, verify, close) called under a timeout, off the event loop.

Sync callables run in daemon threads and never wait for one (an idle thread is reused, else one
starts), so a timeout measures the call alone and a stuck call never keeps the process alive.
Calls stuck past their timeout are counted per owner (an environment), which is refused more
past a cap; SystemExit, KeyboardInterrupt and CancelledError raised by the code end only its call.
"""

from __future__ import annotations

import asyncio
import functools
import os
import queue
import threading
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Callable

from gym_bridge.core.errors import AbortedCall, RolloutError

if TYPE_CHECKING:
    from gym_bridge.core.environment import Environment

__all__ = ["StuckCallsError", "call_bounded", "call_environment", "stuck_calls"]

MAX_STUCK_CALLS_PER_OWNER = 64
"""Calls of one owner still running past their timeout before its later calls are refused."""
MAX_THREADS = 4096
"""Threads at most (running and idle); beyond it calls are refused rather than queued."""
IDLE_THREAD_EXIT_S = 30.0
"""An idle thread exits after this long without work."""


class StuckCallsError(RolloutError, RuntimeError):
    """Refused: the owner already has too many calls stuck past their timeout (or the process too many threads)."""

    failure_kind = "env"


async def call_bounded(fn: Callable[..., Any], *args: Any, timeout_s: float, owner: str = "", **kwargs: Any) -> Any:
    """Call `fn` (sync or async) with a timeout and return its result; sync callables run in a daemon thread.

    `owner` (an environment's name) is who the call counts against while stuck. Raises
    TimeoutError when `timeout_s` passes (the thread, if any, is left to finish on its own);
    AbortedCall when `fn` raises SystemExit, KeyboardInterrupt or its own CancelledError;
    StuckCallsError when `owner` has `MAX_STUCK_CALLS_PER_OWNER` calls still stuck; whatever
    else `fn` raises. A cancellation of the caller (the user's Ctrl-C) propagates unchanged.
    """
    if asyncio.iscoroutinefunction(fn):
        return await _await_bounded(fn(*args, **kwargs), timeout_s)
    loop = asyncio.get_running_loop()
    job = _Job(fn, args, kwargs, loop.create_future(), loop, owner)
    _POOL.submit(job)
    try:
        async with asyncio.timeout(timeout_s):
            result = await job.future
    except BaseException:  # timed out or cancelled: the thread runs on, counted as stuck
        _POOL.abandon(job)
        raise
    if isinstance(result, Awaitable):
        return await _await_bounded(result, timeout_s)
    return result


async def call_environment(
    env: "Environment", method: str, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None, *, timeout_s: float
) -> Any:
    """Call `env.<method>(*args, **kwargs)` under `timeout_s`: in a worker process when the
    environment sets `isolate_tools` (the session travels there and back), else as `call_bounded` does.

    Raises what `call_bounded` raises; with isolation also `WorkerCrashed` when the worker died.
    """
    env_class = type(env)
    if env_class.isolate_tools:
        from gym_bridge.core.bounded.isolation import call_isolated

        return await call_isolated(env, method, args, kwargs or {}, timeout_s=timeout_s)
    fn = getattr(env, method)
    if kwargs:  # bound here, so no argument name can clash with call_bounded's own
        fn = functools.partial(fn, **kwargs)
    return await call_bounded(fn, *args, timeout_s=timeout_s, owner=env_class.name)


async def _await_bounded(awaitable: Awaitable[Any], timeout_s: float) -> Any:
    try:
        async with asyncio.timeout(timeout_s):
            return await awaitable
    except (SystemExit, KeyboardInterrupt) as error:
        raise AbortedCall(error) from None
    except asyncio.CancelledError as error:
        task = asyncio.current_task()
        if task is not None and task.cancelling():  # the caller was cancelled: not ours to swallow
            raise
        raise AbortedCall(error) from None


def stuck_calls() -> dict[str, int]:
    """Calls still running past their timeout, by owner (only owners with some)."""
    with _POOL.lock:
        return {owner: count for owner, count in _POOL.stuck.items() if count}


class _Job:
    __slots__ = ("fn", "args", "kwargs", "future", "loop", "owner", "finished", "abandoned")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                 future: asyncio.Future[Any], loop: asyncio.AbstractEventLoop, owner: str) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.future, self.loop, self.owner = future, loop, owner
        self.finished = self.abandoned = False

    def run(self) -> None:
        try:
            value, ok = self.fn(*self.args, **self.kwargs), True
        except Exception as error:
            value, ok = error, False
        except BaseException as error:  # SystemExit & co. raised by the code end only this call
            value, ok = AbortedCall(error), False
        _POOL.finish(self)
        try:
            self.loop.call_soon_threadsafe(_settle, self.future, ok, value)
        except RuntimeError:  # the event loop is closed: nobody waits for this result
            pass
        del self.fn, self.args, self.kwargs  # drop the references: the job object may outlive the call


def _settle(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if future.done():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


class _Worker(threading.Thread):
    def __init__(self, pool: "_ThreadPool", first: _Job) -> None:
        super().__init__(name="gym_bridge_call", daemon=True)
        self.pool = pool
        self.first: _Job | None = first
        self.jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()

    def run(self) -> None:
        job, self.first = self.first, None
        while job is not None:
            job.run()
            job = self.pool.next_job(self)


class _ThreadPool:
    """Daemon threads that grow on demand and exit when idle; stuck calls are counted per owner."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.idle: list[_Worker] = []
        self.threads = 0
        self.stuck: dict[str, int] = {}

    def submit(self, job: _Job) -> None:
        with self.lock:
            if self.stuck.get(job.owner, 0) >= MAX_STUCK_CALLS_PER_OWNER:
                raise StuckCallsError(
                    f"{job.owner or 'this code'} has {self.stuck[job.owner]} calls still running past their timeout; "
                    "not starting more (fix the hang, or give it run_in_process / isolate_tools)"
                )
            worker = self.idle.pop() if self.idle else None
            if worker is None:
                if self.threads >= MAX_THREADS:
                    raise StuckCallsError(f"{self.threads} threads are busy with environment calls; not starting more")
                self.threads += 1
        if worker is not None:
            worker.jobs.put(job)
            return
        try:
            _Worker(self, job).start()
        except BaseException:
            with self.lock:
                self.threads -= 1
            raise

    def next_job(self, worker: _Worker) -> _Job | None:
        """The worker's next job, or None when it stayed idle long enough to exit."""
        with self.lock:
            self.idle.append(worker)
        while True:
            try:
                return worker.jobs.get(timeout=IDLE_THREAD_EXIT_S)
            except queue.Empty:
                with self.lock:
                    if worker in self.idle:
                        self.idle.remove(worker)
                        self.threads -= 1
                        return None
                # a caller took this worker from the idle list just now: its job is on the way

    def finish(self, job: _Job) -> None:
        with self.lock:
            job.finished = True
            if job.abandoned:
                self.stuck[job.owner] -= 1

    def abandon(self, job: _Job) -> None:
        with self.lock:
            if not job.finished and not job.abandoned:
                job.abandoned = True
                self.stuck[job.owner] = self.stuck.get(job.owner, 0) + 1

    def forget(self) -> None:
        """In a forked child: the parent's threads do not exist here."""
        _ThreadPool.__init__(self)


_POOL = _ThreadPool()
os.register_at_fork(after_in_child=_POOL.forget)
