"""Test helpers that run HTTP servers on loopback: an ASGI app in a thread, or `gym-bridge serve-model`
in a subprocess. Both listen on 127.0.0.1 on a free port and are always shut down."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


@contextmanager
def app_in_thread(app) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """Serve an ASGI app with uvicorn in a background thread; yields its base URL (`http://127.0.0.1:P`)."""
    import uvicorn

    from gym_bridge.serve.listen import bind_socket

    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", access_log=False, lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


class ServeModelProcess:
    """`gym-bridge serve-model --port 0` in a subprocess; `url` is its `/v1` base URL once healthy."""

    def __init__(self, *args: str, timeout_s: float = 120.0) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        command = [sys.executable, "-m", "gym_bridge.cli", "serve-model", "--port", "0", *args]
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=self._stderr, text=True,
                                        cwd=Path(__file__).parents[2])
        self.url = ""
        deadline = time.monotonic() + timeout_s
        line = self.process.stdout.readline() if self.process.stdout else ""  # "serving NAME at URL", printed once bound
        if not line.startswith("serving "):
            self.stop()
            raise RuntimeError(f"serve-model did not start: {line!r} {self.stderr()}")
        self.url = line.split(" at ")[-1].strip()
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url.removesuffix("/v1") + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("serve-model did not become healthy")

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()

    def health(self) -> dict:
        return httpx.get(self.url.removesuffix("/v1") + "/health", timeout=5.0).json()

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)
        if self.process.stdout is not None:
            self.process.stdout.close()
