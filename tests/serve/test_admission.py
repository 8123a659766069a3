"""Both HTTP servers bound their work inside the app: past the limit, only the requests over it get a
503 (with `Retry-After`), and `/health` is answered at once however busy the server is or however
many clients hold connections open. The real `serve` functions run (real uvicorn, their own
settings) in a thread on loopback, with real concurrent clients; limit 8, 12 clients."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx
import pytest
import uvicorn

from gym_bridge.serve.agent_server import AgentServerSettings
from gym_bridge.serve.agent_launch import serve as serve_agents
from gym_bridge.serve.listen import bind_socket
from gym_bridge.serve.model_server import serve as serve_model
from tests.support.http_server import app_in_thread

LIMIT, CLIENTS = 8, 12


@contextmanager
def serving(monkeypatch: pytest.MonkeyPatch, start: Callable[[Callable[[str], None]], None]) -> Iterator[str]:
    """`start(on_ready)` (a blocking `serve`) in a thread; yields the URL it reports, then stops its uvicorn server."""
    servers: list[uvicorn.Server] = []

    class Recorded(uvicorn.Server):
        def __init__(self, config: uvicorn.Config) -> None:
            super().__init__(config)
            servers.append(self)

    monkeypatch.setattr(uvicorn, "Server", Recorded)
    urls: list[str] = []
    thread = threading.Thread(target=start, args=(urls.append,), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not (servers and servers[0].started and urls):
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    try:
        yield urls[0]
    finally:
        servers[0].should_exit = True
        thread.join(timeout=15)


def health_under_load(url: str) -> tuple[int, float]:
    started = time.monotonic()
    answer = httpx.get(url, timeout=10)
    return answer.status_code, time.monotonic() - started


def burst(url: str, body: dict[str, Any], *, held: Callable[[], int], release: threading.Event,
          health_url: str) -> tuple[list[httpx.Response], list[httpx.Response], tuple[int, float]]:
    """`CLIENTS` POSTs at once; once `LIMIT` are held by the model and the rest answered, probe health,
    then release. Returns the answers before the release, those after, and health's status and latency."""

    async def main() -> tuple[list[httpx.Response], list[httpx.Response], tuple[int, float]]:
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=CLIENTS)) as client:
            posts = [asyncio.ensure_future(client.post(url, json=body)) for _ in range(CLIENTS)]
            deadline = time.monotonic() + 30
            while held() < LIMIT or sum(post.done() for post in posts) < CLIENTS - LIMIT:
                if time.monotonic() > deadline:
                    release.set()
                    break
                await asyncio.sleep(0.05)
            answered = {position for position, post in enumerate(posts) if post.done()}
            health = await asyncio.to_thread(health_under_load, health_url)
            release.set()
            answers = await asyncio.gather(*posts)
        early = [answer for position, answer in enumerate(answers) if position in answered]
        return early, [answer for position, answer in enumerate(answers) if position not in answered], health

    return asyncio.run(main())


def test_serve_refuses_only_runs_past_its_limit_and_health_always_answers(monkeypatch, weather_row) -> None:
    asked: list[float] = []
    release = threading.Event()

    async def held_model(request: Any) -> Any:
        from fastapi.responses import JSONResponse

        asked.append(time.monotonic())
        while not release.is_set():
            await asyncio.sleep(0.02)
        return JSONResponse({"error": {"message": "released"}}, status_code=503)

    from fastapi import FastAPI

    model_app = FastAPI()
    model_app.add_route("/v1/chat/completions", held_model, methods=["POST"])
    with ExitStack() as stack:
        model_url = stack.enter_context(app_in_thread(model_app))
        settings = AgentServerSettings(envs=("weather",), model_base_urls=(model_url + "/v1",), model="m", max_concurrency=LIMIT,
                                       max_retries=0, request_timeout_s=60, deadline_s=60)
        url = stack.enter_context(serving(monkeypatch, lambda on_ready: serve_agents(settings, host="127.0.0.1", port=0,
                                                                                     on_ready=on_ready)))
        # a liveness probe while many clients hold connections open (uvicorn's own limit counted them: 503)
        idle = [stack.enter_context(socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])))) for _ in range(LIMIT + 72)]
        status, _ = health_under_load(url + "/health")
        assert status == 200
        for connection in idle:
            connection.close()
        early, late, (health_status, health_s) = burst(url + "/run", weather_row, held=lambda: len(asked), release=release,
                                                       health_url=url + "/health")
    assert len(asked) == LIMIT  # the model saw the limit's worth of rollouts, no more
    assert [answer.status_code for answer in early] == [503] * (CLIENTS - LIMIT)  # only those over the limit...
    assert all(answer.headers["retry-after"] == "1" and "--max-concurrency" in answer.json()["detail"] for answer in early)
    assert [answer.status_code for answer in late] == [200] * LIMIT  # ...the others ran (failing as infra: the model refused)
    assert all(answer.json()["mask_sample"] and "released" in answer.json()["failure_reason"] for answer in late)
    assert health_status == 200 and health_s < 2.0  # with the limit's rollouts in flight and refusals answered


class Held:
    """A `TransformersPolicy` whose generations wait until `release` is set (so requests stay in flight)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.waiting, self.release = inner, 0, threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def generate(self, request: Any) -> Any:
        self.waiting += 1
        while not self.release.is_set():
            await asyncio.sleep(0.02)
        return await self.inner.generate(request)


def test_serve_model_refuses_only_the_requests_past_its_limit(monkeypatch, tiny_model_dir) -> None:
    from gym_bridge.policies.transformers import TransformersPolicy

    policy = Held(TransformersPolicy.from_pretrained(tiny_model_dir, device="cpu", batch_wait_s=0.01))
    sock = bind_socket("127.0.0.1", 0)
    with serving(monkeypatch, lambda on_ready: serve_model(policy, model_name="tiny", sock=sock, max_requests=LIMIT,
                                                           on_ready=on_ready)) as url:
        early, late, (health_status, health_s) = burst(url + "/completions", {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 2},
                                                       held=lambda: policy.waiting, release=policy.release,
                                                       health_url=url.removesuffix("/v1") + "/health")
        models = httpx.get(url + "/models", timeout=10)
    sock.close()
    # before: uvicorn counted the 12 open connections against a limit of 8 and refused all but a few
    assert [answer.status_code for answer in early] == [503] * (CLIENTS - LIMIT)
    assert all(answer.headers["retry-after"] == "1" and answer.json()["error"]["code"] == 503 for answer in early)
    assert [answer.status_code for answer in late] == [200] * LIMIT and policy.waiting == LIMIT
    assert health_status == 200 and health_s < 2.0 and models.status_code == 200


@pytest.fixture
def weather_row() -> dict[str, Any]:
    from gym_bridge.core.registry import get_environment

    path = get_environment("weather").example_data
    assert path is not None
    return dict(json.loads(open(path, encoding="utf-8").readline()))
