"""Run CPU-heavy or possibly hanging functions in worker processes, off the event loop.

`run_in_process(fn, *args, timeout_s=...)` sends one call to a small set of persistent worker
processes, one call per worker at a time, and awaits it without blocking the event loop. A call
stuck in C code (a sympy simplification, a regex) cannot be interrupted inside its worker, so on
timeout its worker is killed and replaced; calls running in the other workers go on.
Workers start from a forkserver (spawn where there is none), never by forking the caller: the
caller may have threads, CUDA or torch state that a fork would corrupt. As with any spawned
process, the forkserver imports the caller's main script once: guard its entry point with
`if __name__ == "__main__":`; its top-level imports are paid once, when the pool first starts.
Workers end with the process that started them, even when it is killed with SIGKILL. A worker
is recycled (stopped, and replaced on demand) after `max_tasks_per_worker` calls or once its
resident memory passes `max_memory_mb` (`set_worker_limits`), so state that leaks from call to
call, such as an isolated environment's, cannot grow without bound.
"""

from __future__ import annotations

import asyncio
import atexit
import ctypes
import multiprocessing
import os
import pickle
import select
import signal
import sys
import threading
import time
import traceback
import weakref
from concurrent.futures import BrokenExecutor, ProcessPoolExecutor
from typing import Any, Callable

__all__ = ["run_in_process", "set_pool_size", "set_worker_limits", "shutdown_pool"]

DEFAULT_MAX_TASKS_PER_WORKER = 1000
"""Calls one worker process runs before it is recycled."""
DEFAULT_MAX_WORKER_MEMORY_MB = 2048.0
"""Resident memory (MiB) past which a worker is recycled after its call (read from /proc, so Linux only)."""


async def run_in_process(fn: Callable[..., Any], *args: Any, timeout_s: float) -> Any:
    """Run `fn(*args)` in a worker process and return its result.

    `fn` and `args` are pickled, so `fn` must be a function defined at module level of an
    importable module (not a lambda, a closure or a nested function). The result must be
    picklable too. A call that finds no idle worker starts one (about 0.1 s, plus the main
    script's top-level imports the first time) before its clock starts; the worker then imports
    `fn`'s module.

    `timeout_s` bounds the run in the worker, not the wait for a free worker: a call waits
    (without a clock) while all workers of its event loop are busy. Each worker runs one call at
    a time, so a call that hangs, exits or crashes its process takes down only its own worker:
    calls running beside it are not affected.

    Raises TimeoutError when `fn` runs past `timeout_s` (its worker is killed); the exception
    `fn` raised, as the same type with the worker's traceback as a note (a RuntimeError naming
    the original type when that exception cannot be pickled); TypeError when `fn` or `args`
    cannot be pickled; BrokenExecutor when the worker died while running `fn` (os._exit, a
    signal, a segfault). If the awaiting task is cancelled while `fn` runs, its worker is killed.
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    try:
        job = pickle.dumps((fn, args))
    except Exception as error:
        raise TypeError(
            f"run_in_process needs a module-level function and picklable arguments; {_name(fn)}: {error}"
        ) from None
    async with _POOL.slot():
        for attempt in range(2):
            worker = _POOL.take_idle()
            if worker is None:
                worker = await asyncio.to_thread(_POOL.start_worker)
            healthy = False
            try:
                outcome = await _run_once(worker, job, fn, timeout_s)
                healthy = True
                break
            except _StaleWorker:
                if attempt == 1:
                    raise BrokenExecutor("worker processes die before they can take a call") from None
            finally:
                _POOL.give_back(worker, healthy=healthy)
    return _unpack(outcome, fn)


def set_pool_size(max_workers: int) -> None:
    """Use at most `max_workers` processes at once from now on (default: `min(2, os.cpu_count())`).

    Idle workers beyond the new size stop; calls already running finish.
    """
    if max_workers < 1:
        raise ValueError(f"max_workers must be at least 1, got {max_workers}")
    _POOL.resize(max_workers)


def set_worker_limits(
    *, max_tasks_per_worker: int | None = DEFAULT_MAX_TASKS_PER_WORKER, max_memory_mb: float | None = DEFAULT_MAX_WORKER_MEMORY_MB
) -> None:
    """Recycle a worker process after `max_tasks_per_worker` calls, or after a call that leaves its
    resident memory above `max_memory_mb` MiB (checked on Linux only); None turns a limit off.

    A recycled worker finishes its call, is stopped, and a fresh one starts with the next call
    (about 0.1 s). The memory limit is checked between calls: it bounds growth from call to call,
    not a single call that allocates more. Defaults: 1000 calls, 2048 MiB.
    """
    if max_tasks_per_worker is not None and max_tasks_per_worker < 1:
        raise ValueError(f"max_tasks_per_worker must be at least 1 (or None), got {max_tasks_per_worker}")
    if max_memory_mb is not None and max_memory_mb <= 0:
        raise ValueError(f"max_memory_mb must be positive (or None), got {max_memory_mb}")
    _POOL.max_tasks_per_worker, _POOL.max_memory_mb = max_tasks_per_worker, max_memory_mb


def shutdown_pool() -> None:
    """Stop the worker processes: busy ones at once, idle ones cleanly. Runs at exit."""
    _POOL.shutdown()


class _StaleWorker(Exception):
    """An idle worker turned out dead before it took the call."""


async def _run_once(worker: ProcessPoolExecutor, job: bytes, fn: Callable[..., Any], timeout_s: float) -> bytes:
    try:
        future = worker.submit(_call, job)
    except RuntimeError:  # the worker died while idle (killed from outside): the call never ran
        raise _StaleWorker() from None
    waiter = asyncio.wrap_future(future)
    try:
        done, _ = await asyncio.wait({waiter}, timeout=timeout_s)
    except asyncio.CancelledError:
        waiter.cancel()
        raise
    if not done:
        waiter.cancel()
        raise TimeoutError(f"{_name(fn)} did not finish within {timeout_s:g} s; its worker was killed")
    return waiter.result()


def _call(job: bytes) -> bytes:
    """Worker side: run the job and pickle its outcome, so every failure reaches the caller intact."""
    try:
        fn, args = pickle.loads(job)
        value = fn(*args)
    except BaseException as error:
        return _pack_error(error)
    try:
        return pickle.dumps((True, value, ""))
    except Exception as error:
        return _pack_error(TypeError(f"the result of {_name(fn)} cannot be pickled: {error}"))


def _pack_error(error: BaseException) -> bytes:
    trace = "".join(traceback.format_exception(error))
    if isinstance(error, Exception):  # never send SystemExit or KeyboardInterrupt to the caller
        try:
            packed = pickle.dumps((False, error, trace))
            pickle.loads(packed)
            return packed
        except Exception:
            pass
    return pickle.dumps((False, RuntimeError(f"{type(error).__name__}: {error}"), trace))


def _unpack(outcome: bytes, fn: Callable[..., Any]) -> Any:
    try:
        ok, value, trace = pickle.loads(outcome)
    except Exception as error:
        raise RuntimeError(f"cannot unpickle what {_name(fn)} returned: {error}") from None
    if ok:
        return value
    value.add_note(f"Raised in a worker process:\n{trace}")
    raise value


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def _ready() -> None:
    """A no-op that makes a worker start."""


_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int) -> None:
    """Worker initializer: end this worker when `parent_pid` (the process that started the pool) ends.

    A worker's parent is the forkserver, so on Linux it asks for SIGKILL when that one dies
    (prctl PR_SET_PDEATHSIG), and everywhere a daemon thread watches the pool's owner itself.
    """
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass
    threading.Thread(target=_exit_when_gone, args=(parent_pid,), name="gym_bridge_parent_watch", daemon=True).start()


def _exit_when_gone(pid: int) -> None:
    try:
        handle = os.pidfd_open(pid)  # readable once the process exits; immune to pid reuse
    except (AttributeError, OSError):
        handle = None
    if handle is not None:
        select.select([handle], [], [])
        os._exit(1)
    while True:
        time.sleep(1.0)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            os._exit(1)
        except PermissionError:
            pass


class _WorkerPool:
    """Single-process executors, each running one call at a time, so a dead or killed worker
    fails only its own call. Shared by every event loop; started lazily; idle ones are reused."""

    def __init__(self) -> None:
        self.max_workers = min(2, os.cpu_count() or 1)
        self.max_tasks_per_worker: int | None = DEFAULT_MAX_TASKS_PER_WORKER
        self.max_memory_mb: float | None = DEFAULT_MAX_WORKER_MEMORY_MB
        self._calls: dict[ProcessPoolExecutor, int] = {}
        """Calls each live worker has finished."""
        self._lock = threading.Lock()
        self._idle: list[ProcessPoolExecutor] = []
        self._busy: set[ProcessPoolExecutor] = set()
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()

    def slot(self) -> asyncio.Semaphore:
        """This event loop's gate: at most `max_workers` of its calls run at once."""
        loop = asyncio.get_running_loop()
        if loop not in self._slots:
            self._slots[loop] = asyncio.Semaphore(self.max_workers)
        return self._slots[loop]

    def take_idle(self) -> ProcessPoolExecutor | None:
        with self._lock:
            if not self._idle:
                return None
            worker = self._idle.pop()
            self._busy.add(worker)
            return worker

    def start_worker(self) -> ProcessPoolExecutor:
        """A new worker, started and ready. Blocks: call it in a thread."""
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        worker = ProcessPoolExecutor(1, mp_context=context, initializer=_die_with_parent, initargs=(os.getpid(),))
        try:
            worker.submit(_ready).result()
        except Exception as error:
            worker.shutdown(wait=False)
            raise RuntimeError(
                f"cannot start a worker process ({error}); if the main script runs code at import, "
                "guard it with `if __name__ == '__main__':`"
            ) from error
        with self._lock:
            self._busy.add(worker)
        return worker

    def give_back(self, worker: ProcessPoolExecutor, *, healthy: bool) -> None:
        """Keep `worker` for the next call, or (broken, hung, cancelled, surplus, worn out) stop it."""
        worn = healthy and self._worn_out(worker)
        with self._lock:
            self._busy.discard(worker)
            keep = healthy and not worn and len(self._idle) < self.max_workers
            if keep:
                self._idle.append(worker)
            else:
                self._calls.pop(worker, None)
        if not keep:
            _stop(worker, kill=not healthy)

    def _worn_out(self, worker: ProcessPoolExecutor) -> bool:
        """Count the call `worker` just finished; True when it reached a recycling limit."""
        with self._lock:
            calls = self._calls[worker] = self._calls.get(worker, 0) + 1
        if self.max_tasks_per_worker is not None and calls >= self.max_tasks_per_worker:
            return True
        if self.max_memory_mb is None:
            return False
        return any(_resident_mb(pid) > self.max_memory_mb for pid in (getattr(worker, "_processes", None) or {}))

    def worker_pids(self) -> list[int]:
        with self._lock:
            workers = [*self._idle, *self._busy]
        return [pid for worker in workers for pid in (getattr(worker, "_processes", None) or {})]

    def resize(self, max_workers: int) -> None:
        with self._lock:
            self.max_workers = max_workers
            self._slots = weakref.WeakKeyDictionary()
            surplus, self._idle = self._idle[max_workers:], self._idle[:max_workers]
            for worker in surplus:
                self._calls.pop(worker, None)
        for worker in surplus:
            worker.shutdown(wait=False)

    def shutdown(self) -> None:
        with self._lock:
            idle, busy = self._idle, list(self._busy)
            self._idle, self._busy, self._calls = [], set(), {}
        for worker in busy:
            _stop(worker, kill=True)
        for worker in idle:
            worker.shutdown(wait=True)

    def forget(self) -> None:
        """In a forked child: the parent's workers are not ours to use or stop."""
        _WorkerPool.__init__(self)


def _resident_mb(pid: int) -> float:
    """The resident memory of process `pid` in MiB (0.0 where /proc cannot tell)."""
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as handle:
            pages = int(handle.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def _stop(worker: ProcessPoolExecutor, *, kill: bool) -> None:
    if kill:  # a hung or cancelled call: its process must go now (Python 3.14 has kill_workers())
        for process in list((getattr(worker, "_processes", None) or {}).values()):
            process.kill()
    worker.shutdown(wait=False, cancel_futures=True)


_POOL = _WorkerPool()
os.register_at_fork(after_in_child=_POOL.forget)
# concurrent.futures joins its pools in a threading-exit hook, which would wait for a hung call
# forever; hooks run in reverse order of registration, so this one, registered later, runs first.
_register_exit_hook = getattr(threading, "_register_atexit", atexit.register)
_register_exit_hook(shutdown_pool)
