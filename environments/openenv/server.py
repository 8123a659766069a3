"""OpenEnv servers gym_bridge starts itself: `python -m uvicorn <app>` in OpenEnv's virtualenv, as a subprocess.

One server per (python, app, app dir) for the whole process, started on the first session that needs it: on
a free loopback port, waited for (`GET /health`) at most `start_timeout_s`, and killed on every path: when it
does not come up, by `stop_servers()`, at interpreter exit, and by the kernel if gym_bridge itself dies (the
child asks for SIGKILL on its parent's death). A server that exits is started again by the next session.
"""

from __future__ import annotations

import asyncio
import atexit
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from environments.openenv.session import OpenEnvError

HEALTH_POLL_S = 0.1
STOP_GRACE_S = 2.0
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ServerSpec:
    """What to run: `python -m uvicorn app --app-dir app_dir`."""

    python: str
    app: str
    """`module:attribute` of the ASGI app, as uvicorn takes it (OpenEnv's `server/app.py` exposes `app`)."""
    app_dir: str


@dataclass
class RunningServer:
    spec: ServerSpec
    process: subprocess.Popen[bytes]
    url: str
    log: Path


_servers: dict[ServerSpec, RunningServer] = {}
_locks: dict[tuple[ServerSpec, int], asyncio.Lock] = {}
"""A start lock per server and event loop (a lock belongs to the loop it first waits on)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _die_with_parent() -> None:  # runs in the child before exec
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _launch(spec: ServerSpec) -> RunningServer:
    port = free_port()
    log = Path(tempfile.mkstemp(prefix="openenv-server-", suffix=".log")[1])
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [spec.python, "-m", "uvicorn", spec.app, "--app-dir", spec.app_dir, "--host", "127.0.0.1", "--port", str(port),
               "--log-level", "warning"]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                   preexec_fn=_die_with_parent)
    return RunningServer(spec=spec, process=process, url=f"http://127.0.0.1:{port}", log=log)


async def _wait_healthy(server: RunningServer, timeout_s: float) -> None:
    """Return once `/health` answers 200; raises OpenEnvError (with the log's tail) when the process exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=1.0) as client:
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                raise OpenEnvError(f"the OpenEnv server {server.spec.app} exited ({server.process.returncode}) while starting: {tail(server.log)}")
            try:
                if (await client.get(server.url + "/health")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(HEALTH_POLL_S)
    raise OpenEnvError(f"the OpenEnv server {server.spec.app} did not answer /health within {timeout_s:g} s: {tail(server.log)}")


async def server_url(spec: ServerSpec, *, start_timeout_s: float) -> str:
    """The URL of the running server for `spec`, started (once, under a lock) when there is none or it exited."""
    lock = _locks.setdefault((spec, id(asyncio.get_running_loop())), asyncio.Lock())
    async with lock:
        running = _servers.get(spec)
        if running is not None and running.process.poll() is None:
            return running.url
        server = _launch(spec)
        try:
            await _wait_healthy(server, start_timeout_s)
        except BaseException:
            _stop(server)
            raise
        _servers[spec] = server
        return server.url


def _stop(server: RunningServer) -> None:
    if server.process.poll() is None:
        server.process.terminate()
        try:
            server.process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()
    server.log.unlink(missing_ok=True)


def stop_servers() -> None:
    """Stop every server this process started (also run at exit)."""
    while _servers:
        _stop(_servers.popitem()[1])
    _locks.clear()


def tail(log: Path, chars: int = 600) -> str:
    try:
        text = log.read_text(errors="replace").strip()
    except OSError:
        return "(no log)"
    return text[-chars:] or "(no output)"


atexit.register(stop_servers)
