"""The gym_bridge side of the BFCL worker: finds `.venv-bfcl`'s python, starts `worker.py` there, and sends it requests.

One worker process serves every BFCL rollout of this process (BFCL's data loads once); requests are one JSON line
each way, one at a time under a lock. A request that gets no answer within its bound kills the worker (the next
request starts a new one) and raises `WorkerError`, as does a worker that exits or answers something that is not JSON.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from gym_bridge import MissingExtraError, RolloutError

INSTALL_HINT = "BFCL runs in a virtualenv of its own: run `make install-bfcl` in the gym_bridge checkout (creates .venv-bfcl), or set GYM_BRIDGE_BFCL_PYTHON to a python that has bfcl-eval==2026.3.23"
WORKER = Path(__file__).with_name("worker.py")
START_TIMEOUT_S = 180.0
"""Bound on the first answer of a new worker: importing BFCL loads every model handler's SDK (about 10 s here)."""


class WorkerError(RolloutError):
    """The worker failed (exited, hung, answered garbage) or refused a request; the message says which. A rollout
    that meets it fails as `env` (`BfclEnvironment.request` names the kind its step fails as)."""

    failure_kind = "env"


def worker_python() -> Path | None:
    """The python that runs the worker: $GYM_BRIDGE_BFCL_PYTHON, else `.venv-bfcl` of this checkout or of the
    current directory; None when there is none."""
    configured = os.environ.get("GYM_BRIDGE_BFCL_PYTHON")
    if configured:
        return Path(configured) if Path(configured).exists() else None
    for root in (Path(__file__).resolve().parents[2], Path.cwd()):
        candidate = root / ".venv-bfcl" / "bin" / "python"
        if candidate.exists():
            return candidate
    return None


def require_worker_python() -> Path:
    """`worker_python()`, or MissingExtraError with the install command."""
    python = worker_python()
    if python is None:
        raise MissingExtraError(INSTALL_HINT)
    return python


class Worker:
    """A running worker process; `request` is safe to call from several threads."""

    def __init__(self, python: Path) -> None:
        self.python = python
        self._lock = threading.Lock()
        self._process: subprocess.Popen[str] | None = None
        self._fresh = False

    def _start(self) -> subprocess.Popen[str]:
        self._process = subprocess.Popen(
            [str(self.python), str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, env={**os.environ, "PYTHONPATH": ""},
        )
        self._fresh = True
        return self._process

    def _read_line(self, process: subprocess.Popen[str], timeout_s: float) -> str:
        assert process.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            if not selector.select(timeout_s):
                self.kill()
                raise WorkerError(f"the BFCL worker gave no answer within {timeout_s:g} s (it was stopped)")
        line = process.stdout.readline()
        if not line:
            code = process.wait()
            self._process = None
            raise WorkerError(f"the BFCL worker exited (code {code}); check that `{self.python} {WORKER}` starts")
        return line

    def request(self, op: str, *, timeout_s: float = 60.0, **fields: Any) -> Any:
        """Send one request; returns its result. Raises WorkerError for a failed worker or a refused request."""
        with self._lock:
            process = self._process if self._process is not None and self._process.poll() is None else self._start()
            assert process.stdin is not None
            try:
                process.stdin.write(json.dumps({"op": op, **fields}) + "\n")
                process.stdin.flush()
            except (BrokenPipeError, OSError) as error:
                self._process = None
                raise WorkerError(f"the BFCL worker is gone: {error}") from None
            bound = max(timeout_s, START_TIMEOUT_S) if self._fresh else timeout_s
            started = time.monotonic()
            line = self._read_line(process, bound)
            self._fresh = False
            try:
                answer = json.loads(line)
            except json.JSONDecodeError:
                self.kill()
                raise WorkerError(f"the BFCL worker answered something that is not JSON after {time.monotonic() - started:.1f} s: {line[:200]!r}") from None
        if not isinstance(answer, dict) or "ok" not in answer:
            raise WorkerError(f"the BFCL worker answered an unexpected shape: {line[:200]!r}")
        if not answer["ok"]:
            raise WorkerError(str(answer.get("error")))
        return answer.get("result")

    def kill(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()


_shared: Worker | None = None
_shared_lock = threading.Lock()


def shared_worker() -> Worker:
    """This process's worker (started on its first request); MissingExtraError when `.venv-bfcl` is missing."""
    global _shared
    with _shared_lock:
        python = require_worker_python()
        if _shared is None or _shared.python != python:
            _shared = Worker(python)
        return _shared


@atexit.register
def _stop_shared() -> None:
    if _shared is not None:
        _shared.kill()
