"""An exclusive lock that ends with the process holding it: one writer per rollout file, one per journal folder.

`flock` on a lock file that names its holder (pid and host). A second process is refused at once, told who holds it.
The holder removes the file while still holding the lock; a process that locked the removed file sees that it is gone
and locks the file now at the path, so two processes never hold different files. A killed holder leaves the file
behind, unlocked (the lock ends with the process), and the next process takes it over.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Callable


def acquire(path: Path, refuse: Callable[[str], Exception]) -> int | None:
    """Lock `path` (created as needed, its folder must exist) and write this process's pid and host into it. Returns
    the lock's descriptor for `release` (None on a system without POSIX locks). Raises `refuse(holder)` at once, with
    the holder as the file names it (`"<pid> on <host>"`), when another process holds the lock."""
    try:
        import fcntl
    except ImportError:  # not a POSIX system: no lock
        return None
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 256).decode("utf-8", "replace").strip() or "unknown"
            os.close(fd)
            raise refuse(holder) from None
        if _is_current(fd, path):
            break
        os.close(fd)  # its holder removed it as we locked it: lock the file now at that path
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()} on {socket.gethostname()}\n".encode())
    return fd


def release(fd: int | None, path: Path) -> None:
    """Remove the lock file `path` (while still locked, see the module's docstring) and unlock it."""
    if fd is None:
        return
    import fcntl

    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def _is_current(fd: int, path: Path) -> bool:
    """Whether the open file `fd` is still the file at `path` (not removed or replaced)."""
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (on_disk.st_dev, on_disk.st_ino) == (opened.st_dev, opened.st_ino)
