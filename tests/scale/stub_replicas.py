"""Stub model replicas on loopback for the scale tests: `benchmarks/stub_server.py`'s app (vLLM's wire
format, turns decided from the prompt ids), each in its own thread, recording which episode (the
first user message of the prompt) every request belongs to, and stoppable mid-run."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import orjson
from aiohttp import web
from tests.support.scripts import load_script

_USER = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.DOTALL)
_STUB_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "stub_server.py"


def _stub_module() -> ModuleType:
    return load_script(_STUB_PATH, "gym_bridge_stub_server")


@dataclass
class StubReplica:
    url: str
    episodes: list[str] = field(default_factory=list)
    """The first user message of each request's prompt, in arrival order."""
    stop: object = None


@contextmanager
def stub_replicas(count: int, *, delay_s: float = 0.0) -> Iterator[list[StubReplica]]:
    """`count` stub servers; `replica.stop()` shuts one down (its open connections drop)."""
    from gym_bridge.policies.embedded import embedded_model_path

    module = _stub_module()
    replicas, threads = [], []
    for _ in range(count):
        stub = module.Stub(embedded_model_path())
        app = module.build_app(stub, delay_s=delay_s)
        replica = StubReplica(url="")

        @web.middleware
        async def record(request, handler, replica=replica, stub=stub):  # type: ignore[no-untyped-def]
            if request.path.endswith("/completions"):
                body = orjson.loads(await request.read())
                users = _USER.findall(stub.tokenizer.decode(body["prompt"], skip_special_tokens=False))
                replica.episodes.append(users[0] if users else "")
            return await handler(request)

        app.middlewares.append(record)
        loop = asyncio.new_event_loop()
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        replica.url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"

        def stop(loop=loop, runner=runner) -> None:
            if loop.is_running():
                asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
                loop.call_soon_threadsafe(loop.stop)

        replica.stop = stop
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        replicas.append(replica)
        threads.append(thread)
    try:
        yield replicas
    finally:
        for replica in replicas:
            replica.stop()  # type: ignore[operator]
