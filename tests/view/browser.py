"""Headless Chromium driven over the DevTools protocol (a websocket, spoken with aiohttp).

`Browser` starts `chromium --headless --remote-debugging-port=0` with a fresh profile, reads the
websocket address it prints, opens one page, records every network request the page makes, and
lets a test evaluate JavaScript and take screenshots. Only what the report test needs.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--remote-debugging-port=0",
    "--window-size=1400,1000", "--hide-scrollbars",
)


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


class Browser:
    def __init__(self) -> None:
        self.profile = tempfile.mkdtemp(prefix="gym_bridge_chromium_")
        self.process: subprocess.Popen[str] | None = None
        self.requests: list[str] = []
        self.console_errors: list[str] = []
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._events: dict[str, asyncio.Event] = {}

    async def __aenter__(self) -> "Browser":
        executable = chromium_path()
        assert executable, "chromium is not installed"
        self.process = subprocess.Popen([executable, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        browser_url = await asyncio.wait_for(asyncio.to_thread(self._devtools_url), timeout=60)
        port = re.search(r":(\d+)/", browser_url).group(1)  # type: ignore[union-attr]
        self.session = aiohttp.ClientSession()
        async with self.session.get(f"http://127.0.0.1:{port}/json/list") as response:
            targets = await response.json(content_type=None)
        page = next(target for target in targets if target["type"] == "page")
        self.socket = await self.session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        self._reader = asyncio.create_task(self._read())
        for domain in ("Page", "Network", "Runtime"):
            await self.send(f"{domain}.enable")
        return self

    def _devtools_url(self) -> str:
        assert self.process is not None and self.process.stderr is not None
        for line in self.process.stderr:
            if "DevTools listening on" in line:
                return line.split("DevTools listening on", 1)[1].strip()
        raise RuntimeError("chromium exited without opening its DevTools port")

    async def _read(self) -> None:
        async for message in self.socket:
            data = json.loads(message.data)
            if "id" in data and data["id"] in self._pending:
                future = self._pending.pop(data["id"])
                if "error" in data:
                    future.set_exception(RuntimeError(str(data["error"])))
                else:
                    future.set_result(data.get("result", {}))
            elif data.get("method") == "Network.requestWillBeSent":
                self.requests.append(data["params"]["request"]["url"])
            elif data.get("method") == "Runtime.exceptionThrown":
                self.console_errors.append(json.dumps(data["params"]["exceptionDetails"])[:500])
            elif data.get("method") == "Page.loadEventFired":
                self._events.setdefault("load", asyncio.Event()).set()

    async def send(self, method: str, **params: Any) -> Any:
        message_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[message_id] = future
        await self.socket.send_str(json.dumps({"id": message_id, "method": method, "params": params}))
        return await asyncio.wait_for(future, timeout=30)

    async def open(self, url: str) -> None:
        loaded = self._events["load"] = asyncio.Event()
        await self.send("Page.navigate", url=url)
        await asyncio.wait_for(loaded.wait(), timeout=30)

    async def evaluate(self, expression: str) -> Any:
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def screenshot(self, path: Path) -> None:
        result = await self.send("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(result["data"]))

    async def __aexit__(self, *exc: object) -> None:
        self._reader.cancel()
        await self.socket.close()
        await self.session.close()
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        shutil.rmtree(self.profile, ignore_errors=True)
