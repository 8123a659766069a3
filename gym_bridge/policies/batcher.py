"""One request batcher for the in-process policies (transformers, the vLLM engine).

Concurrent `submit` calls are queued; one background task per event loop gathers a batch under a
`GatherRule` (a quiet gap since the last arrival, a longest wait after the first, a largest size,
and an optional `fits` test, such as a padded-token bound, whose misfit opens the next batch),
optionally splits it into groups one call can serve, and runs the batch function on each group in a
worker thread. Each request's future gets its own result or exception; an exception raised by the
batch function fails every request of that group as a `BackendError`. A request whose caller gave up
(its future is done) is left out of the group it would run in. Stopping the worker fails every
request it holds with a `BackendError` instead of leaving it waiting.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from gym_bridge.core.errors import BackendError

RequestT = TypeVar("RequestT")
ResultT = TypeVar("ResultT")


@dataclass(frozen=True)
class Waiting(Generic[RequestT, ResultT]):
    """One queued request, the future its caller awaits, and when it was queued (`time.perf_counter`)."""

    request: RequestT
    future: asyncio.Future[ResultT]
    enqueued_at_s: float


@dataclass(frozen=True)
class GatherRule:
    """When a batch closes: `max_batch_size` requests, no new one for `quiet_gap_s`, or `max_wait_s`
    after its first. A fixed window is `quiet_gap_s == max_wait_s`."""

    max_batch_size: int
    quiet_gap_s: float
    max_wait_s: float

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {self.max_batch_size}")


BatchFunction = Callable[[list[Waiting[RequestT, ResultT]]], Sequence["ResultT | BaseException"]]


class Batcher(Generic[RequestT, ResultT]):
    """Gathers concurrent requests into batches and runs `run_batch` on them in a worker thread.

    `run_batch` returns one result (or exception, to fail that request alone) per request, in order.
    `fits(batch, request)` says whether `request` may join the requests gathered so far; one that
    does not opens the next batch. `split` cuts a gathered batch into groups run one after another.
    """

    def __init__(
        self,
        run_batch: BatchFunction[RequestT, ResultT],
        *,
        rule: GatherRule,
        name: str,
        fits: Callable[[Sequence[RequestT], RequestT], bool] | None = None,
        split: Callable[[list[Waiting[RequestT, ResultT]]], list[list[Waiting[RequestT, ResultT]]]] | None = None,
    ) -> None:
        self.run_batch = run_batch
        self.rule = rule
        self.name = name
        self._fits = fits
        self._split = split
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[Waiting[RequestT, ResultT]] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._carried: Waiting[RequestT, ResultT] | None = None
        """A request that did not fit the last batch: it opens the next one."""

    @property
    def worker(self) -> asyncio.Task[None] | None:
        """The running gathering task (None before the first request and after `aclose`)."""
        return self._worker

    async def submit(self, request: RequestT) -> ResultT:
        """Queue `request` for the next batch on the running loop and wait for its result."""
        future: asyncio.Future[ResultT] = asyncio.get_running_loop().create_future()
        self._queue_on_running_loop().put_nowait(Waiting(request=request, future=future, enqueued_at_s=time.perf_counter()))
        return await future

    def stop(self) -> None:
        """Cancel the worker from any thread; the requests it holds fail with `BackendError`."""
        worker, loop = self._worker, self._loop
        if worker is None or loop is None or loop.is_closed() or worker.done():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            worker.cancel()
        else:
            loop.call_soon_threadsafe(worker.cancel)

    async def aclose(self) -> None:
        """Stop the worker (on the running loop) and wait until it is gone; a later `submit` starts a new one."""
        worker, self._worker = self._worker, None
        if worker is not None and not worker.done():
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)

    def _queue_on_running_loop(self) -> asyncio.Queue[Waiting[RequestT, ResultT]]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._queue is None or self._worker is None or self._worker.done():
            self._loop, self._queue, self._carried = loop, asyncio.Queue(), None
            self._worker = loop.create_task(self._serve(self._queue), name=f"{self.name} worker")
        return self._queue

    async def _serve(self, queue: asyncio.Queue[Waiting[RequestT, ResultT]]) -> None:
        batch: list[Waiting[RequestT, ResultT]] = []
        try:
            while True:
                await self._collect(queue, batch)
                for group in self._split(batch) if self._split is not None else [batch]:
                    await self._run_group(group)
                batch.clear()
        except asyncio.CancelledError:
            if self._carried is not None:
                batch.append(self._carried)
                self._carried = None
            while not queue.empty():
                batch.append(queue.get_nowait())
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(BackendError(f"{self.name} was closed before generating"))
            raise

    async def _collect(self, queue: asyncio.Queue[Waiting[RequestT, ResultT]], batch: list[Waiting[RequestT, ResultT]]) -> None:
        """Append to `batch` the next request and those that follow it under the rule."""
        loop = asyncio.get_running_loop()
        first, self._carried = self._carried, None
        batch.append(first if first is not None else await queue.get())
        cap_s = loop.time() + self.rule.max_wait_s
        while len(batch) < self.rule.max_batch_size:
            remaining_s = min(self.rule.quiet_gap_s, cap_s - loop.time())
            try:
                item = queue.get_nowait() if remaining_s <= 0 else await asyncio.wait_for(queue.get(), remaining_s)
            except (asyncio.QueueEmpty, TimeoutError):
                break
            if self._fits is not None and not self._fits([waiting.request for waiting in batch], item.request):
                self._carried = item
                break
            batch.append(item)

    async def _run_group(self, group: list[Waiting[RequestT, ResultT]]) -> None:
        live = [item for item in group if not item.future.done()]
        if not live:
            return
        try:
            results = await asyncio.to_thread(self.run_batch, live)
        except Exception as error:  # the worker must never die with requests waiting
            for item in live:
                if not item.future.done():
                    backend_error = BackendError(f"generation failed: {type(error).__name__}: {error}")
                    backend_error.__cause__ = error
                    item.future.set_exception(backend_error)
            return
        for item, result in zip(live, results, strict=True):
            if item.future.done():
                continue
            if isinstance(result, BaseException):
                item.future.set_exception(result)
            else:
                item.future.set_result(result)
