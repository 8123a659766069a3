"""The reaper of one harness command: it starts the command under its resource limits (rlimits, which all
it starts inherits; not the reaper's own), reports when it exits, and then kills every process the command
left behind, also those that left its process group or session (`setsid`, a daemon's double fork). On Linux
it is a child subreaper (PR_SET_CHILD_SUBREAPER): orphaned descendants become its children, found by /proc's
parent links. Run by `gym_bridge.capture.harness` as `python -I -S reaper.py CONTROL_FD REPORT_FD [LIMIT=N...]
-- ARGV...`; it imports only the standard library (it starts in tens of milliseconds) and must stay that way.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import select
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
"""prctl(2) option: orphaned descendants are re-parented to this process, not to init."""
KILL_LIMIT_S = 5.0
"""How long the reaper keeps killing and reaping before it gives up on what it cannot kill."""
POLL_S = 0.05
"""Wake-up period while waiting (only without pidfds); zombies of adopted orphans are reaped then too."""
LIMITS = {"data": resource.RLIMIT_DATA, "cpu": resource.RLIMIT_CPU}
"""The limits a caller may set, by the name it passes (`data=BYTES`, `cpu=SECONDS`)."""
CPU_GRACE_S = 1
"""The hard CPU limit is this much above the soft one: SIGXCPU at the soft limit, SIGKILL for one that ignores it."""


def parse_limits(words: list[str]) -> dict[int, int]:
    """`data=BYTES cpu=SECONDS` as {resource: value}; raises ValueError for an unknown name or a bad value."""
    limits: dict[int, int] = {}
    for word in words:
        name, _, value = word.partition("=")
        if name not in LIMITS or not value.isdigit() or int(value) < 1:
            raise ValueError(f"bad limit {word!r}: give data=BYTES or cpu=SECONDS")
        limits[LIMITS[name]] = int(value)
    return limits


def set_limits(limits: dict[int, int]) -> None:
    """Set `limits` in this process (the command's, before exec: its descendants inherit them), never above the
    hard limit it already has; no core files (SIGXCPU would dump one into the working directory)."""
    for which, value in limits.items():
        _, hard = resource.getrlimit(which)
        top = value + CPU_GRACE_S if which == resource.RLIMIT_CPU else value
        if hard != resource.RLIM_INFINITY:
            value, top = min(value, hard), min(top, hard)
        resource.setrlimit(which, (value, top))
    if limits:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def become_subreaper() -> bool:
    """Make this process the child subreaper of its descendants; False where the system has none."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def descendants(root: int) -> list[int]:
    """Every process below `root` by /proc's parent links ([] without /proc)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rpartition(b")")[2].split()
        except OSError:  # it ended meanwhile
            continue
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            found.append(child)
            stack.append(child)
    return found


class Reaper:
    """Waits for one command and reaps every child this process has (the command, adopted orphans)."""

    def __init__(self, command: subprocess.Popen[bytes]) -> None:
        self.command = command
        self.status: int | None = None
        """The command's exit status once reaped (negative: killed by that signal)."""
        self.cpu_s = 0.0
        """CPU seconds (user and system) of the command and of the children it waited for, once reaped."""

    def reap(self) -> bool:
        """Reap every child that has ended; False when no child is left."""
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            if pid == self.command.pid:
                self.status = os.waitstatus_to_exitcode(status)
                self.cpu_s = usage.ru_utime + usage.ru_stime
                self.command.returncode = self.status

    def wait(self, control_fd: int) -> None:
        """Until the command exits or the control pipe becomes readable (a word, or its end: stop now)."""
        try:
            pidfd: int | None = os.pidfd_open(self.command.pid)
        except (AttributeError, OSError):
            pidfd = None
        watched = [control_fd] if pidfd is None else [control_fd, pidfd]
        try:
            while self.status is None:
                ready, _, _ = select.select(watched, [], [], POLL_S if pidfd is None else 1.0)
                self.reap()
                if control_fd in ready:
                    return
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def kill_all(self) -> None:
        """Kill the command's whole tree, orphans included, until no child is left (or KILL_LIMIT_S passed)."""
        give_up_s = time.monotonic() + KILL_LIMIT_S
        with contextlib.suppress(OSError):
            os.killpg(self.command.pid, signal.SIGKILL)
        while True:
            for pid in descendants(os.getpid()):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            if not self.reap() or time.monotonic() > give_up_s:
                return
            time.sleep(0.005)


def report(fd: int, line: str) -> None:
    with contextlib.suppress(OSError):  # the harness runner is gone: the control pipe says so too
        os.write(fd, (line + "\n").encode("utf-8", "replace"))


def main(argv: list[str]) -> int:
    """`reaper.py CONTROL_FD REPORT_FD [data=BYTES] [cpu=SECONDS] -- ARGV...`: reports `started PID` then `exit
    STATUS CPU_S` (`exit lost`: it could not be reaped), or `error MESSAGE` when the command cannot start (or a
    limit is malformed); exits once nothing of it is left."""
    control_fd, report_fd = int(argv[1]), int(argv[2])
    split = argv.index("--")
    become_subreaper()
    try:
        limits = parse_limits(argv[3:split])
        child = subprocess.Popen(argv[split + 1:], start_new_session=True, preexec_fn=lambda: set_limits(limits))
    except (OSError, ValueError, subprocess.SubprocessError) as error:
        report(report_fd, f"error {error}")
        return 1
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the command's pipes are the command's: once it is gone, nothing holds them open
        os.dup2(null, fd)
    os.close(null)
    report(report_fd, f"started {child.pid}")
    reaper = Reaper(child)
    reaper.wait(control_fd)
    exited = reaper.status is not None
    if exited:  # said at once: what it left behind is killed while its runner drains the pipes
        report(report_fd, f"exit {reaper.status} {reaper.cpu_s:.3f}")
    reaper.kill_all()
    if not exited:
        report(report_fd, "exit lost" if reaper.status is None else f"exit {reaper.status} {reaper.cpu_s:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
