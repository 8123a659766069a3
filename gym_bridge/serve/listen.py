"""Where gym_bridge's two servers listen: a socket bound before anything slow starts, and an app run on it.

`bind_socket` takes the port first, so a busy port is an error naming `--port` before a model loads or model servers
are asked anything; `run_app` serves an ASGI app on that socket with uvicorn and says its URL once uvicorn has started.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from gym_bridge.core.errors import SetupError

READY_POLL_S = 0.005
"""How often `run_app` looks whether uvicorn has started, to say the URL."""


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening-ready socket on `host:port` (`port` 0 picks a free one).

    Raises GymBridgeError when the port is in use or the address cannot be bound (before anything
    slow, such as loading a model, happens)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            raise SetupError(f"port {port} on {host} is in use (is a server already running there?); stop it, or pick "
                             "another --port (0 picks a free one)") from None
        raise SetupError(f"cannot listen on {host}:{port}: {error.strerror or error}; check --host and --port") from None
    return sock


def run_app(app: Any, sock: socket.socket, *, on_ready: Callable[[str], None] | None = None, url_path: str = "",
            **uvicorn_settings: Any) -> None:
    """Serve the ASGI `app` on `sock` with uvicorn until interrupted; `on_ready` gets `http://host:port{url_path}`
    once the server has started (its signal handlers installed, the socket accepting), so a client that reads the
    URL can connect at once. `uvicorn_settings` go to `uvicorn.Config` (keep-alive, event sizes); access logs are off."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, **uvicorn_settings))
    if on_ready is not None:
        bound_host, bound_port = sock.getsockname()[:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        url = f"http://{shown}:{bound_port}{url_path}"
        threading.Thread(target=_announce_when_started, args=(server, url, on_ready), name="gym-bridge-ready", daemon=True).start()
    server.run(sockets=[sock])


def _announce_when_started(server: Any, url: str, on_ready: Callable[[str], None]) -> None:
    """Call `on_ready(url)` when uvicorn's `server` says it has started; nothing if it stops first."""
    while not server.started:
        if server.should_exit:
            return
        time.sleep(READY_POLL_S)
    on_ready(url)
