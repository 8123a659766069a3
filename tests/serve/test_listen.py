"""`run_app` says its URL only once the server accepts connections, so a client that reads it can connect at once."""

from __future__ import annotations

import socket
import threading
from typing import Any

from gym_bridge.serve.listen import bind_socket, run_app


async def _hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"hello"})


def test_the_url_is_said_once_a_client_can_connect() -> None:
    sock = bind_socket("127.0.0.1", 0)
    said: list[str] = []
    connected: list[bool] = []
    ready = threading.Event()

    def on_ready(url: str) -> None:
        said.append(url)
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        try:  # a plain TCP connect: refused while the socket is bound but not yet listening
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
            connected.append(True)
        except ConnectionRefusedError:
            connected.append(False)
        ready.set()

    server = threading.Thread(target=run_app, args=(_hello, sock), kwargs={"on_ready": on_ready, "url_path": "/v1"}, daemon=True)
    server.start()
    assert ready.wait(30), "run_app never said its URL"
    assert said == [f"http://127.0.0.1:{sock.getsockname()[1]}/v1"]
    assert connected == [True]
    with socket.create_connection(("127.0.0.1", sock.getsockname()[1]), timeout=5) as client:
        client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := client.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200") and b"hello" in answer
