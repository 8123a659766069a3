"""Running an agent program (a harness) with limits: a command line under a reaper process
(`reaper.py`), or an async Python callable `agent(client, task)` given an `openai.AsyncOpenAI` client.

A command gets the environment it is given and the task on stdin. It is bounded by a wall limit
(writing stdin included) and by per-process memory and CPU limits (`HarnessLimits`, rlimits inherited by
all it starts); it ends when it exits, whatever still holds its output; on its exit, a
timeout, a cancel or when the session stops serving (a budget spent), everything it started is
killed, in its process group or not. Only the last characters of stdout and stderr are kept. What
happened is returned as an `AgentOutcome`; nothing here raises for a harness that crashes or hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import sys
import traceback
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

AgentCallable = Callable[[Any, dict[str, Any]], Awaitable[Any]]
"""`async def agent(client: openai.AsyncOpenAI, task: dict) -> str | None`; a returned string is its answer."""

STOP_GRACE_S = 1.0
"""After the session stops serving, how long a harness may take to end by itself before it is killed."""
REAPER = Path(__file__).with_name("reaper.py")
"""The small process each command runs under: it adopts and kills whatever the command leaves behind."""
REAP_LIMIT_S = 6.0
"""How long the reaper may take to kill a command's tree and end (it gives up on what it cannot kill after 5 s)."""
DRAIN_LIMIT_S = 1.0
"""How long output is still read after the command's tree is gone."""
DEFAULT_MEMORY_LIMIT_MB = 8192
"""RLIMIT_DATA of each process of a command, MiB: far above what an agent program (a Python or Node loop over
an HTTP client, a few hundred MiB) allocates, far below a training machine's memory."""
DEFAULT_CPU_LIMIT_S = 600
"""RLIMIT_CPU of each process of a command, seconds: twice the default wall limit (`harness_timeout_s`, 300 s),
so a single-threaded process cannot reach it before the wall limit; an agent mostly waits for the model."""
OUT_OF_MEMORY = re.compile(r"MemoryError|out of memory|Cannot allocate memory|bad_alloc|memory allocation of \d+ bytes failed", re.I)
"""What runtimes print when an allocation fails (Python, Node, Go, libc's strerror, C++, Rust); none is killed by RLIMIT_DATA."""
LimitKind = Literal["memory", "cpu"]


@dataclass(frozen=True)
class HarnessLimits:
    """Resource limits of a command and of every process it starts (rlimits, set before it runs and inherited:
    they bound each process, not the tree together). None: no limit."""

    memory_mb: int | None = DEFAULT_MEMORY_LIMIT_MB
    """RLIMIT_DATA (heap and private writable mappings) per process, MiB; an allocation past it fails."""
    cpu_s: int | None = DEFAULT_CPU_LIMIT_S
    """RLIMIT_CPU per process, seconds: SIGXCPU then, SIGKILL one second later for a process that ignores it."""

    def to_args(self) -> list[str]:
        """The reaper's limit arguments (`data=BYTES`, `cpu=SECONDS`)."""
        return ([f"data={self.memory_mb * 1024 * 1024}"] if self.memory_mb is not None else []) + (
            [f"cpu={self.cpu_s}"] if self.cpu_s is not None else [])


@dataclass(frozen=True)
class AgentOutcome:
    """How a harness ended."""

    exit_code: int | None
    """The command's exit status (negative: killed by that signal); 0 or 1 for a callable (returned / raised)."""
    stdout_tail: str
    stderr_tail: str
    """For a callable: the traceback of what it raised."""
    timed_out: bool = False
    stopped: bool = False
    """Ended because the session stopped serving (killed or cancelled after the grace period, or exited in it)."""
    answer: str | None = None
    """What a callable returned, when it returned a string."""
    cpu_s: float | None = None
    """CPU seconds a command used (with the children it waited for); None for a callable or when unknown."""
    limit: LimitKind | None = None
    """The resource limit that ended a command, as far as its exit says (`limit_hit`)."""


class _Tail:
    """The last `limit` characters written to it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.text = ""

    def add(self, chunk: str) -> None:
        self.text = (self.text + chunk)[-self.limit:]


async def _pump(stream: asyncio.StreamReader | None, tail: _Tail) -> None:
    if stream is None:
        return
    while chunk := await stream.read(65536):
        tail.add(chunk.decode("utf-8", errors="replace"))


async def _race(work: asyncio.Future[Any], stop: asyncio.Event, timeout_s: float) -> tuple[bool, bool]:
    """Wait for `work`, the stop event (plus a grace period) or the timeout; returns (timed_out, stopped)."""
    stopper = asyncio.ensure_future(stop.wait())
    try:
        done, _ = await asyncio.wait({work, stopper}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if work in done:
        return False, stop.is_set()
    if stopper in done:
        await asyncio.wait({work}, timeout=STOP_GRACE_S)
        return False, True
    return True, False


async def run_command(argv: Sequence[str], *, env: Mapping[str, str], stdin: bytes, timeout_s: float,
                      stop: asyncio.Event, tail_chars: int = 4000, cwd: str | None = None,
                      limits: HarnessLimits = HarnessLimits()) -> AgentOutcome:
    """Run `argv` under its reaper, with `limits`, to its exit, its timeout or the stop event. The wall limit
    also bounds writing `stdin`; the command's exit ends the run, whatever still holds its output; nothing the
    command started outlives this call (in its process group, another session, or a daemon).

    Raises OSError when the command cannot be started (not found, not executable).
    """
    reaped = await _Reaped.start(argv, env=env, cwd=cwd, limits=limits)
    stdout, stderr = _Tail(tail_chars), _Tail(tail_chars)
    process = reaped.process
    readers = [asyncio.ensure_future(_pump(process.stdout, stdout)), asyncio.ensure_future(_pump(process.stderr, stderr))]
    feeder = asyncio.ensure_future(_feed(process, stdin))
    try:
        timed_out, stopped = await _race(reaped.status, stop, timeout_s)
    finally:
        with contextlib.suppress(asyncio.CancelledError):  # a cancelled rollout still ends its command's tree
            await asyncio.shield(asyncio.ensure_future(reaped.close(readers, feeder)))
    exit_code = reaped.exit_code()
    return AgentOutcome(exit_code=exit_code, stdout_tail=stdout.text, stderr_tail=stderr.text, timed_out=timed_out,
                        stopped=stopped, cpu_s=reaped.cpu_s, limit=limit_hit(exit_code, reaped.cpu_s, stderr.text, limits))


def limit_hit(exit_code: int | None, cpu_s: float | None, stderr_tail: str, limits: HarnessLimits) -> LimitKind | None:
    """Which limit a command's exit shows it hit, or None: `cpu` for SIGXCPU, or SIGKILL after using the CPU limit
    (what the hard limit sends a process that ignores SIGXCPU), each also as a shell's status 128 + the signal for
    a child it ran (`cpu_s` counts the children it waited for); `memory` for a failed exit whose stderr names a
    failed allocation (`OUT_OF_MEMORY`; RLIMIT_DATA kills nothing, the allocation fails)."""
    if exit_code in (None, 0):
        return None
    if limits.cpu_s is not None and (exit_code in (-signal.SIGXCPU, 128 + signal.SIGXCPU) or (
            exit_code in (-signal.SIGKILL, 128 + signal.SIGKILL) and cpu_s is not None and cpu_s >= limits.cpu_s)):
        return "cpu"
    if limits.memory_mb is not None and OUT_OF_MEMORY.search(stderr_tail):
        return "memory"
    return None


class _Reaped:
    """A command run under its reaper (`reaper.py`): the reaper's process, whose stdin, stdout and stderr
    the command holds, and its reports (the command's pid, then its exit status) on a pipe of their own."""

    def __init__(self, process: asyncio.subprocess.Process, control_fd: int, reports: asyncio.StreamReader,
                 transport: asyncio.BaseTransport) -> None:
        self.process = process
        self.control_fd: int | None = control_fd
        self.reports, self.transport = reports, transport
        self.command_pid: int | None = None
        self.cpu_s: float | None = None
        self.status: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        """The command's exit status, once it exited or was killed (an OSError when it could not start)."""
        self.follower = asyncio.ensure_future(self._follow())

    @classmethod
    async def start(cls, argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None, limits: HarnessLimits) -> _Reaped:
        """Start the reaper, which starts `argv` with `limits`; raises OSError when the reaper cannot start."""
        control_read, control_fd = os.pipe()
        report_fd, report_write = os.pipe()
        try:
            process = await asyncio.create_subprocess_exec(
                _python(), "-I", "-S", str(REAPER), str(control_read), str(report_write), *limits.to_args(), "--", *argv,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env=dict(env), cwd=cwd, start_new_session=True, pass_fds=(control_read, report_write))
        except BaseException:
            os.close(control_fd)
            os.close(report_fd)
            raise
        finally:
            os.close(control_read)
            os.close(report_write)
        reports = asyncio.StreamReader()
        transport, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reports), os.fdopen(report_fd, "rb", buffering=0))
        return cls(process, control_fd, reports, transport)

    async def _follow(self) -> None:
        """Read the reports to their end: `started PID`, `exit STATUS CPU_S` (or `exit lost`), or `error MESSAGE`."""
        try:
            while line := (await self.reports.readline()).decode("utf-8", "replace").strip():
                word, _, rest = line.partition(" ")
                if word == "started":
                    self.command_pid = int(rest)
                elif word in ("exit", "error") and not self.status.done():
                    if word == "error":
                        self.status.set_exception(OSError(rest))
                    else:
                        status, _, cpu = rest.partition(" ")
                        self.cpu_s = float(cpu) if cpu else None
                        self.status.set_result(int(status) if status.lstrip("-").isdigit() else None)
        finally:
            if not self.status.done():  # the reaper ended without a word (killed)
                self.status.set_result(None)

    def exit_code(self) -> int | None:
        """The command's exit status (None when unknown); raises the OSError of a command that could not start."""
        return self.status.result() if self.status.done() else None

    def stop(self) -> None:
        """Tell the reaper to kill everything now: a word, not only the pipe's end, since a forked copy of
        this process may hold the pipe open too."""
        if self.control_fd is not None:
            with contextlib.suppress(OSError):
                os.write(self.control_fd, b"k")
            os.close(self.control_fd)
            self.control_fd = None

    async def close(self, readers: Sequence[asyncio.Future[None]], feeder: asyncio.Future[None]) -> None:
        """Kill what is left, read the output that remains (bounded), and end every task and pipe."""
        self.stop()
        await asyncio.wait({self.follower}, timeout=REAP_LIMIT_S)  # the reaper ends once nothing of the command is left
        await asyncio.wait(readers, timeout=DRAIN_LIMIT_S)
        if not self.follower.done() or not await _ended(self.process, DRAIN_LIMIT_S):
            self._kill_groups()  # the reaper itself was killed or hangs: what its process groups still hold
            await _ended(self.process, DRAIN_LIMIT_S)
        for task in (*readers, feeder, self.follower):
            task.cancel()
        self.transport.close()

    def _kill_groups(self) -> None:
        for group in (self.process.pid, self.command_pid):
            if group is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(group, signal.SIGKILL)


def _python() -> str:
    return sys.executable or shutil.which("python3") or "python3"


async def _ended(process: asyncio.subprocess.Process, timeout_s: float) -> bool:
    """Whether `process` ended (and its pipes closed: asyncio waits for both) within `timeout_s`."""
    try:
        await asyncio.wait_for(asyncio.shield(process.wait()), timeout=timeout_s)
    except TimeoutError:
        return False
    return True


async def _feed(process: asyncio.subprocess.Process, data: bytes) -> None:
    """Write the task to stdin and close it. A harness need not read stdin: the write is dropped when the
    harness ends, or when the run ends without it having read it all."""
    if process.stdin is None:
        return
    try:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            process.stdin.write(data)
            await process.stdin.drain()
            process.stdin.close()
    except asyncio.CancelledError:
        process.stdin.transport.abort()
        raise


async def run_callable(agent: AgentCallable, client: Any, task: dict[str, Any], *, timeout_s: float,
                       stop: asyncio.Event, tail_chars: int = 4000) -> AgentOutcome:
    """Run `agent(client, task)` to its end, its timeout or the stop event (then it is cancelled)."""
    work = asyncio.ensure_future(agent(client, task))
    try:
        timed_out, stopped = await _race(work, stop, timeout_s)
    finally:
        if not work.done():
            work.cancel()
            with contextlib.suppress(BaseException):
                await work
    if timed_out or (stopped and work.cancelled()):
        return AgentOutcome(exit_code=None, stdout_tail="", stderr_tail="", timed_out=timed_out, stopped=stopped)
    error = work.exception()
    if error is not None:
        text = "".join(traceback.format_exception(error))[-tail_chars:]
        return AgentOutcome(exit_code=1, stdout_tail="", stderr_tail=text, stopped=stopped)
    result = work.result()
    return AgentOutcome(exit_code=0, stdout_tail="", stderr_tail="", stopped=stopped,
                        answer=result if isinstance(result, str) else None)
