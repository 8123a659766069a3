"""Running an agent program (a harness) with limits: a command line in its own process group,
or an async Python callable `agent(client, task)` given an `openai.AsyncOpenAI` client.

Both point at the rollout's capture endpoint. A command gets `OPENAI_BASE_URL`, `OPENAI_API_KEY`
and `OPENAI_MODEL` in its environment and the task as JSON on stdin (`HarnessLoop` also writes it to the file named by
`GYM_BRIDGE_TASK_FILE`). It is bounded by a wall limit; on timeout, on cancel or when the session
stops serving (a budget spent) the whole process group is killed. Only the last characters of
stdout and stderr are kept. What happened is returned as an `AgentOutcome`; nothing here raises
for a harness that crashes or hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import traceback
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

AgentCallable = Callable[[Any, dict[str, Any]], Awaitable[Any]]
"""`async def agent(client: openai.AsyncOpenAI, task: dict) -> str | None`; a returned string is its answer."""

STOP_GRACE_S = 1.0
"""After the session stops serving, how long a harness may take to end by itself before it is killed."""


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


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


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
                      stop: asyncio.Event, tail_chars: int = 4000, cwd: str | None = None) -> AgentOutcome:
    """Run `argv` to its end, its timeout or the stop event; the process group never outlives this call.

    Raises OSError when the command cannot be started (not found, not executable).
    """
    process = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=dict(env), cwd=cwd, start_new_session=True)
    stdout, stderr = _Tail(tail_chars), _Tail(tail_chars)
    readers = [asyncio.ensure_future(_pump(process.stdout, stdout)), asyncio.ensure_future(_pump(process.stderr, stderr))]
    waiter = asyncio.ensure_future(process.wait())
    try:
        await _feed(process, stdin)
        timed_out, stopped = await _race(waiter, stop, timeout_s)
    finally:
        _kill_group(process.pid)  # also children left behind by a leader that exited
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(waiter)
        await asyncio.wait(readers, timeout=1.0)
        for reader in readers:
            reader.cancel()
    return AgentOutcome(exit_code=process.returncode, stdout_tail=stdout.text, stderr_tail=stderr.text,
                        timed_out=timed_out, stopped=stopped)


async def _feed(process: asyncio.subprocess.Process, data: bytes) -> None:
    """Write the task to stdin and close it; a harness that does not read stdin is fine."""
    if process.stdin is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        process.stdin.write(data)
        await process.stdin.drain()
    process.stdin.close()


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
