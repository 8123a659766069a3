"""What the web framework costs per request: the capture endpoint's aiohttp.web against FastAPI on uvicorn (the
framework of serve-model and `gym-bridge serve`), to decide whether the three servers can share one framework.

Both servers run in the client's own event loop, as the capture endpoint does (it serves the harness of the rollout
running on that loop), on loopback, and answer the same handler: the body read with the servers' one reader
(`gym_bridge.core.request_body.read_json`), a canned chat completion answered as JSON. An `httpx.AsyncClient` posts a
capture-sized chat body one call at a time; the two frameworks alternate run by run (`--runs`, `--calls` each) so
machine load hits both alike. `extra_us_per_call` is FastAPI's median per-call time minus aiohttp's, in the client's
loop; `extra_us_per_call_thread` the same with uvicorn in a thread of its own (as the tests run serve-model).
Run: `.venv/bin/python benchmarks/server_framework.py` (about a minute). The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gym_bridge.core.request_body import json_object, read_json  # noqa: E402

MAX_BYTES = 16 * 1024 * 1024
BODY = {"model": "policy", "messages": [{"role": "system", "content": "You are a coding agent. " * 40},
                                         {"role": "user", "content": "Fix the failing test in tests/test_x.py. " * 10}],
        "tools": [{"type": "function", "function": {"name": f"tool_{n}", "description": "does a thing " * 8,
                                                    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}
                  for n in range(6)]}
ANSWER = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "policy",
          "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "done", "tool_calls": []}}],
          "usage": {"prompt_tokens": 900, "completion_tokens": 2, "total_tokens": 902}}


async def aiohttp_server() -> tuple[str, Any]:
    from aiohttp import web

    async def chat(request: web.Request) -> web.Response:
        json_object(await read_json(request.content.iter_any(), content_length=request.headers.get("Content-Length"), max_bytes=MAX_BYTES))
        return web.json_response(ANSWER)

    app = web.Application()
    app.router.add_post("/s/{token}/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return f"http://127.0.0.1:{runner.addresses[0][1]}/s/t/v1", runner.cleanup


def fastapi_app() -> Any:
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    async def chat(request: Request) -> JSONResponse:
        json_object(await read_json(request.stream(), content_length=request.headers.get("content-length"), max_bytes=MAX_BYTES))
        return JSONResponse(ANSWER)

    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    app.add_route("/s/{token}/v1/chat/completions", chat, methods=["POST"])
    return app


async def fastapi_server() -> tuple[str, Any]:
    """uvicorn serving in the client's loop, as the capture endpoint serves today."""
    import uvicorn

    from gym_bridge.serve.listen import bind_socket

    app = fastapi_app()
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)

    async def stop() -> None:
        server.should_exit = True
        await serving
        sock.close()

    return f"http://127.0.0.1:{sock.getsockname()[1]}/s/t/v1", stop


async def fastapi_thread_server() -> tuple[str, Any]:
    """uvicorn serving in a thread of its own (its own loop): what serve-model's tests do."""
    import threading

    import uvicorn

    from gym_bridge.serve.listen import bind_socket

    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(fastapi_app(), log_level="warning", access_log=False, lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        await asyncio.sleep(0.01)

    async def stop() -> None:
        server.should_exit = True
        await asyncio.to_thread(thread.join, 10)
        sock.close()

    return f"http://127.0.0.1:{sock.getsockname()[1]}/s/t/v1", stop


async def per_call_us(client: Any, url: str, calls: int) -> float:
    body = json.dumps(BODY).encode()
    headers = {"Content-Type": "application/json"}
    for _ in range(20):  # warm-up
        (await client.post(url + "/chat/completions", content=body, headers=headers)).raise_for_status()
    started = time.perf_counter()
    for _ in range(calls):
        (await client.post(url + "/chat/completions", content=body, headers=headers)).raise_for_status()
    return (time.perf_counter() - started) / calls * 1e6


async def main(runs: int, calls: int) -> dict[str, Any]:
    import httpx

    urls, stops = {}, []
    for name, start in (("aiohttp", aiohttp_server), ("fastapi", fastapi_server), ("fastapi_thread", fastapi_thread_server)):
        urls[name], stop = await start()
        stops.append(stop)
    times: dict[str, list[float]] = {name: [] for name in urls}
    async with httpx.AsyncClient(timeout=30) as client:
        for run in range(runs):
            for name in (list(urls) if run % 2 == 0 else list(reversed(urls))):  # alternate the order
                times[name].append(await per_call_us(client, urls[name], calls))
    for stop in stops:
        await stop()
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {**{f"{name}_us_per_call": round(median, 1) for name, median in medians.items()},
            "extra_us_per_call": round(medians["fastapi"] - medians["aiohttp"], 1),
            "extra_us_per_call_thread": round(medians["fastapi_thread"] - medians["aiohttp"], 1),
            "ranges_us": {name: [round(min(values), 1), round(max(values), 1)] for name, values in times.items()},
            "runs": runs, "calls": calls, "machine": _machine(), "load_1m": round(os.getloadavg()[0], 2)}


def _machine() -> str:
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout.splitlines()
        model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("Model name")), "unknown")
    except OSError:
        model = "unknown"
    return f"{model}, {os.cpu_count()} CPUs"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.runs, args.calls))))
