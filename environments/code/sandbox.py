"""Run untrusted Python in a bubblewrap sandbox, off the event loop, with every resource bounded.

Each run gets fresh namespaces (no network, no view of host processes), a read-only root made of
/usr (plus the interpreter's prefix), a private size-capped /tmp as its working directory, a
read-only /dev with a size-capped /dev/shm, its files read-only under /sandbox, none of the
trainer's environment variables (bwrap itself starts without them), and a seccomp filter against
SysV shared memory. Inside, `harness.py` sets CPU-time, address-space, process,
file-size and open-file limits before the solution runs. The host bounds wall time and captured
output, and afterwards kills the whole process group: with bwrap gone its PID namespace dies, so
nothing the solution started survives. Run as root, each concurrent run uses its own unprivileged
uid (unique per process too), so the process limit is per run and root's files stay unreadable.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import json
import os
import platform
import shutil
import signal
import struct
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gym_bridge import UserError

HARNESS = Path(__file__).with_name("harness.py")
SANDBOX_UID_BASE = 100_000_000
"""Root runs each concurrent sandbox as its own uid/gid (no such user exists): see `sandbox_uid`."""
MAX_SLOTS = 256
BWRAP_SETUP_PROCESSES = 3
"""bwrap, its PID-1 reaper and the harness: counted against the process limit before the solution."""

_CPU_LIMIT_STATUSES = {-signal.SIGXCPU, -signal.SIGKILL, 128 + signal.SIGXCPU, 128 + signal.SIGKILL}
"""RLIMIT_CPU's signals, as Python reports them (negative) and as bwrap passes them on (128 + N)."""

Mode = Literal["stdin", "call"]
Failure = Literal["timeout", "output_limit", "cpu_limit", "memory_limit", "process_limit", "runtime_error"]


SANDBOX_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8", "PYTHONDONTWRITEBYTECODE": "1"}
"""The whole environment of the sandbox, of bwrap itself too: bwrap is PID 1 inside, and its
/proc/1/environ is readable there, so it must not start with the trainer's (API keys, tokens)."""


_SYSV_IPC_CREATE = {"x86_64": (0xC000003E, (29, 64, 68)), "aarch64": (0xC00000B7, (194, 190, 186))}
"""Per machine: the seccomp audit arch, and the numbers of shmget, semget and msgget. A SysV IPC
object lives in the sandbox's IPC namespace, outside every rlimit, until the run ends: 800 MB of
shared memory took one second. The filter fails these calls with EPERM."""


class SandboxUnavailable(UserError):
    """The sandbox cannot start on this machine; the message says why and what to do."""


@dataclass(frozen=True)
class SandboxLimits:
    """Bounds of one sandboxed run."""

    wall_time_s: float = 10.0
    cpu_time_s: int = 5
    memory_mb: int = 512
    """Address space of each process (RLIMIT_AS)."""
    max_processes: int = 16
    """Processes and threads the solution may add (RLIMIT_NPROC)."""
    max_output_bytes: int = 1_000_000
    """Captured stdout plus stderr; past it the run is killed."""
    max_file_bytes: int = 16_000_000
    """Largest file the solution may write (RLIMIT_FSIZE)."""
    tmp_mb: int = 64
    """Size of the private /tmp."""
    shm_mb: int = 16
    """Size of the private /dev/shm (POSIX shared memory, multiprocessing's semaphores); the rest of /dev is read-only."""
    max_open_files: int = 64


@dataclass(frozen=True)
class SandboxResult:
    """What one run did."""

    started: bool
    """The harness reached the solution; False means the sandbox itself failed (an infrastructure problem)."""
    exit_code: int | None
    """The process's exit status; negative for a signal, None when killed on the wall-clock limit."""
    stdout: bytes
    stderr: bytes
    timed_out: bool
    output_truncated: bool
    wall_s: float

    @property
    def failure(self) -> Failure | None:
        """Why the run failed, or None for a clean exit with status 0."""
        if self.timed_out:
            return "timeout"
        if self.output_truncated:
            return "output_limit"
        if self.exit_code in _CPU_LIMIT_STATUSES:
            return "cpu_limit"
        if self.exit_code != 0 and b"MemoryError" in self.stderr[-4000:]:
            return "memory_limit"
        if self.exit_code != 0 and b"BlockingIOError: [Errno 11]" in self.stderr[-4000:]:
            return "process_limit"
        if self.exit_code != 0:
            return "runtime_error"
        return None

    def stderr_tail(self, max_chars: int = 400) -> str:
        return self.stderr.decode("utf-8", "replace")[-max_chars:]


@dataclass(frozen=True)
class _Captured:
    stdout: bytes
    stderr: bytes
    timed_out: bool
    truncated: bool


def sandbox_uid(pid: int, slot: int) -> int:
    """The uid of sandbox `slot` of process `pid`: distinct across processes (say, trainer ranks on
    one node), because the kernel counts the process limit per uid. Below 2**31, which bwrap needs."""
    return SANDBOX_UID_BASE + (pid % 4_194_304) * MAX_SLOTS + slot


def default_python() -> str:
    """The interpreter solutions run under: the system Python if there is one, else this one's base."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


class Sandbox:
    """Runs solutions under bwrap (or, with `unsafe_no_sandbox`, directly: no isolation at all).

    At most `max_concurrency` runs at once per event loop; the others wait without a clock.
    """

    def __init__(
        self, limits: SandboxLimits, *, python: str | None = None, max_concurrency: int | None = None, unsafe_no_sandbox: bool = False
    ) -> None:
        self.limits = limits
        self.python = python or default_python()
        self.max_concurrency = min(MAX_SLOTS, max_concurrency or max(2, os.cpu_count() or 2))
        self.unsafe_no_sandbox = unsafe_no_sandbox
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Queue[int]] = weakref.WeakKeyDictionary()

    # -- one run -----------------------------------------------------------------------------

    async def run(self, mode: Mode, solution: str, *, stdin: bytes = b"", tests: dict | None = None) -> SandboxResult:
        """Run `solution` once: as a program on `stdin` (`stdin` mode) or calling `tests["fn_name"]` on
        each of `tests["arguments"]` (`call` mode). Never raises for what the solution does."""
        slots = self._slot_queue()
        slot = await slots.get()
        run_dir = Path(tempfile.mkdtemp(prefix="gym_bridge_code_"))
        try:
            run_dir.chmod(0o755)
            _write(run_dir / "solution.py", solution)
            _write(run_dir / "harness.py", _harness_source())
            if tests is not None:
                _write(run_dir / "tests.json", json.dumps(tests))
            return await self._execute(mode, run_dir, slot, stdin)
        finally:
            slots.put_nowait(slot)
            shutil.rmtree(run_dir, ignore_errors=True)

    def _slot_queue(self) -> asyncio.Queue[int]:
        loop = asyncio.get_running_loop()
        queue = self._slots.get(loop)
        if queue is None:
            queue = self._slots[loop] = asyncio.Queue()
            for slot in range(self.max_concurrency):
                queue.put_nowait(slot)
        return queue

    async def _execute(self, mode: Mode, run_dir: Path, slot: int, stdin: bytes) -> SandboxResult:
        ready_read, ready_write = os.pipe()
        pass_fds = [ready_write]
        program = None if self.unsafe_no_sandbox else seccomp_program()
        if program is not None:
            pass_fds.append(_readable_pipe(program))
        as_root = os.geteuid() == 0 and not self.unsafe_no_sandbox
        extra_processes = BWRAP_SETUP_PROCESSES if as_root else _processes_of(os.getuid())
        limits = {
            "cpu_time_s": self.limits.cpu_time_s, "memory_bytes": self.limits.memory_mb * 2**20,
            "max_processes": self.limits.max_processes + extra_processes, "max_file_bytes": self.limits.max_file_bytes,
            "max_open_files": self.limits.max_open_files,
        }
        harness = [self.python, "-I", "harness.py" if self.unsafe_no_sandbox else "/sandbox/harness.py", mode, str(ready_write), json.dumps(limits)]
        options: dict = {"pass_fds": tuple(pass_fds), "start_new_session": True, "env": dict(SANDBOX_ENV)}
        if self.unsafe_no_sandbox:
            command, options["cwd"] = harness, run_dir
        else:
            command = bwrap_command(run_dir, self.python, self.limits, seccomp_fd=pass_fds[1] if program else None) + harness
        started_s = time.perf_counter()
        try:
            if as_root:
                command = drop_privileges(sandbox_uid(os.getpid(), slot)) + command
            process = await asyncio.create_subprocess_exec(
                *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, **options
            )
        except OSError as error:
            os.close(ready_read)
            return SandboxResult(False, None, b"", f"cannot start the sandbox: {error}".encode(), False, False, 0.0)
        finally:
            for fd in pass_fds:
                os.close(fd)
        try:
            captured = await self._communicate(process, stdin)
        except BaseException:  # cancelled (a rollout deadline): the sandbox must not outlive us
            _kill_group(process.pid)
            os.close(ready_read)
            with contextlib.suppress(BaseException):  # reap it, so its transport closes on this loop
                await asyncio.wait_for(process.wait(), timeout=2.0)
            raise
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), timeout=5.0)
        return SandboxResult(
            started=_read_ready(ready_read), exit_code=None if captured.timed_out else process.returncode, stdout=captured.stdout,
            stderr=captured.stderr, timed_out=captured.timed_out, output_truncated=captured.truncated, wall_s=time.perf_counter() - started_s,
        )

    async def _communicate(self, process: asyncio.subprocess.Process, stdin: bytes) -> _Captured:
        """Feed stdin and collect output until both pipes close, the wall-clock limit or the output
        limit; then kill the process group. Output past the limit is read and dropped, so a full
        pipe never blocks."""
        kept = {"stdout": bytearray(), "stderr": bytearray()}
        seen = [0]
        over = asyncio.Event()

        async def collect(stream: asyncio.StreamReader | None, name: str) -> None:
            assert stream is not None
            while chunk := await stream.read(65536):
                room = self.limits.max_output_bytes - seen[0]
                if room > 0:
                    kept[name] += chunk[:room]
                seen[0] += len(chunk)
                if seen[0] > self.limits.max_output_bytes:
                    over.set()

        async def feed() -> None:
            assert process.stdin is not None
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                process.stdin.write(stdin)
                await process.stdin.drain()
                process.stdin.close()

        feeding = asyncio.ensure_future(feed())
        reading = asyncio.gather(collect(process.stdout, "stdout"), collect(process.stderr, "stderr"))
        limit = asyncio.ensure_future(over.wait())
        waiting: set[asyncio.Future[Any]] = {reading, limit}
        try:
            done, _ = await asyncio.wait(waiting, timeout=self.limits.wall_time_s, return_when=asyncio.FIRST_COMPLETED)
            timed_out, truncated = not done, over.is_set()
            if not reading.done() or process.returncode is None:  # still running, or its descendants hold the pipes
                _kill_group(process.pid)
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(reading, timeout=5.0)
        finally:
            for future in (feeding, limit, reading):
                future.cancel()
        return _Captured(bytes(kept["stdout"]), bytes(kept["stderr"]), timed_out=timed_out and not truncated, truncated=truncated)


def drop_privileges(uid: int) -> list[str]:
    """The command prefix that runs what follows as `uid`, with no supplementary groups.

    util-linux's `setpriv` rather than `create_subprocess_exec(user=, group=, extra_groups=)`:
    uvloop's event loop (the one `gym-bridge eval` runs on) does not accept those arguments.
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise FileNotFoundError("setpriv (util-linux) is needed to run the sandbox as root: apt-get install util-linux")
    return [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]


def bwrap_command(run_dir: Path, python: str, limits: SandboxLimits, *, seccomp_fd: int | None = None) -> list[str]:
    """The bwrap invocation for one run (the harness command follows it); `seccomp_fd` holds the
    filter of `seccomp_program()`."""
    command = [
        shutil.which("bwrap") or "bwrap",
        "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
        "--ro-bind", "/usr", "/usr",
    ]
    if seccomp_fd is not None:
        command += ["--seccomp", str(seccomp_fd)]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            command += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            command += ["--ro-bind", top, top]
    prefix = _prefix_of(python)
    if prefix is not None:
        command += ["--ro-bind", prefix, prefix]
    command += [
        "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache",
        "--proc", "/proc", "--dev", "/dev",
        "--size", str(limits.shm_mb * 2**20), "--perms", "1777", "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
        "--size", str(limits.tmp_mb * 2**20), "--perms", "1777", "--tmpfs", "/tmp",
        "--ro-bind", str(run_dir), "/sandbox",
        "--remount-ro", "/",
        "--chdir", "/tmp",
        "--clearenv",
    ]
    for name, value in SANDBOX_ENV.items():
        command += ["--setenv", name, value]
    command.append("--")
    return command


_BPF_LOAD_WORD, _BPF_JUMP_EQUAL, _BPF_JUMP_AT_LEAST, _BPF_RETURN = 0x20, 0x15, 0x35, 0x06
_SECCOMP_ALLOW, _SECCOMP_ERRNO, _X32_SYSCALL_BIT = 0x7FFF0000, 0x00050000, 0x40000000


@functools.lru_cache(maxsize=1)
def seccomp_program(machine: str | None = None) -> bytes | None:
    """A classic-BPF seccomp filter (bwrap's `--seccomp` format: packed `struct sock_filter`s) that
    fails SysV IPC creation (shmget, semget, msgget) with EPERM, and every call of another ABI
    (i386's `int 0x80`, x32), which could reach them by other numbers. None on other machines."""
    arch, numbers = _SYSV_IPC_CREATE.get(machine or platform.machine(), (None, ()))
    if arch is None:
        return None
    denied = _SECCOMP_ERRNO | errno.EPERM
    count = len(numbers)
    program = [
        (_BPF_LOAD_WORD, 0, 0, 4),                         # seccomp_data.arch
        (_BPF_JUMP_EQUAL, 1, 0, arch),
        (_BPF_RETURN, 0, 0, denied),                      # another ABI
        (_BPF_LOAD_WORD, 0, 0, 0),                         # seccomp_data.nr
        (_BPF_JUMP_AT_LEAST, count + 1, 0, _X32_SYSCALL_BIT),
        *((_BPF_JUMP_EQUAL, count - position, 0, number) for position, number in enumerate(numbers)),
        (_BPF_RETURN, 0, 0, _SECCOMP_ALLOW),
        (_BPF_RETURN, 0, 0, denied),
    ]
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


def _readable_pipe(data: bytes) -> int:
    """The read end of a pipe that holds `data` (small enough for the pipe's buffer) and then ends."""
    read_fd, write_fd = os.pipe()
    os.write(write_fd, data)
    os.close(write_fd)
    return read_fd


@functools.lru_cache(maxsize=8)
def probe(python: str) -> str | None:
    """Why bwrap cannot run a trivial program here, or None when it can (checked once per interpreter)."""
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (no `bwrap` on PATH): apt-get install bubblewrap (Debian/Ubuntu) or dnf install bubblewrap"

    async def attempt() -> SandboxResult:
        sandbox = Sandbox(SandboxLimits(wall_time_s=30.0), python=python, max_concurrency=1)
        return await sandbox.run("stdin", "print('sandbox ok')")

    result = asyncio.run(attempt()) if not _loop_running() else _run_in_thread(attempt)
    if result.started and result.exit_code == 0 and result.stdout.strip() == b"sandbox ok":
        return None
    detail = result.stderr_tail(600).strip() or f"exit status {result.exit_code}"
    return f"bubblewrap is installed but cannot start a sandbox here ({detail}); unprivileged user namespaces may be disabled"


def _run_in_thread(factory) -> SandboxResult:  # type: ignore[no-untyped-def]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(factory())).result()


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _prefix_of(python: str) -> str | None:
    """The directory tree an interpreter outside /usr needs (its installation prefix), or None."""
    real = os.path.realpath(python)
    if real.startswith("/usr/"):
        return None
    return str(Path(real).parent.parent)


@functools.lru_cache(maxsize=1)
def _harness_source() -> str:
    return HARNESS.read_text(encoding="utf-8")


def _write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    path.chmod(0o644)


def _read_ready(fd: int) -> bool:
    try:
        os.set_blocking(fd, False)
        return os.read(fd, 1) == b"1"
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _processes_of(uid: int) -> int:
    """How many processes `uid` runs now: RLIMIT_NPROC counts them all, not just the sandbox's."""
    count = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError):
            for line in status.read_text().splitlines():
                if line.startswith("Uid:"):
                    count += int(line.split()[1]) == uid
                    break
    return count
