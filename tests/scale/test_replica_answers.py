"""A replica is judged by whether its answer was usable, not by its HTTP status: an HTTP 200 with a
body a rollout cannot use (no choices, ids outside the tokenizer's vocabulary) counts as that
replica's error, takes it out of routing for `down_for_s` (so new episodes go elsewhere), and a
rollout that fails on it names the replica and the offending ids. Real loopback stub servers."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from aiohttp import web

from gym_bridge.cli import main
from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.task import parse_task
from gym_bridge.policies.embedded import embedded_model_path
from gym_bridge.policies.remote import RemotePolicy
from tests.scale.stub_replicas import stub_replicas
from tests.policies.test_router import CITIES, _weather_rows

OUTSIDE = 10_000_000
"""An id no tokenizer here has (SmolLM2's has 49,152)."""


def no_choices(body: dict[str, Any]) -> dict[str, Any]:
    return {"id": "cmpl-1", "object": "text_completion", "choices": []}


def outside_ids(body: dict[str, Any]) -> dict[str, Any]:
    """vLLM's shape, well formed, but one sampled id is outside the vocabulary."""
    ids = [28, OUTSIDE, 2]
    choice: dict[str, Any] = {"index": 0, "text": "ok", "finish_reason": "stop", "token_ids": ids,
                              "logprobs": {"token_logprobs": [-0.5] * 3, "tokens": [f"token_id:{token}" for token in ids]}}
    if body.get("return_token_ids"):
        choice["prompt_token_ids"] = body["prompt"]
    return {"id": "cmpl-1", "object": "text_completion", "choices": [choice]}


@contextmanager
def bad_replica(answer: Callable[[dict[str, Any]], dict[str, Any]]) -> Iterator[str]:
    """A loopback server listing model `stub` and answering every completion with HTTP 200 and `answer(body)`."""

    async def completions(request: web.Request) -> web.Response:
        return web.json_response(answer(await request.json()))

    async def models(request: web.Request) -> web.Response:
        entry = {"id": "stub", "object": "model", "root": str(embedded_model_path()), "max_model_len": 32768}
        return web.json_response({"object": "list", "data": [entry]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


def run(urls: list[str], template, *, rows: list[dict[str, Any]], vocab: bool = True) -> tuple[list[Any], dict[str, Any]]:  # type: ignore[no-untyped-def]
    """`rows` one at a time (so each new episode goes where the router sends it after the previous one);
    `vocab`: the policy checks ids against the template's tokenizer."""
    checked = {"vocab_size": len(template.tokenizer)} if vocab else {}
    policy = RemotePolicy(urls, model="stub", request_timeout_s=10, max_retries=2, backoff_s=0.01, down_for_s=60, **checked)
    engine = Engine(policy, template, EngineConfig(max_concurrency=1, model_name="stub"))

    async def go() -> list[Any]:
        records = [record async for record in engine.stream([parse_task(row, index=i) for i, row in enumerate(rows)])]
        await policy.aclose()
        return records

    return asyncio.run(go()), policy.router.stats()


@pytest.mark.parametrize("answer", [no_choices, outside_ids])
def test_a_replica_answering_200_with_an_unusable_body_counts_errors_and_gets_no_new_episodes(smol_template, answer) -> None:
    with bad_replica(answer) as bad, stub_replicas(1) as good:
        records, stats = run([bad, good[0].url], smol_template, rows=_weather_rows(), vocab=answer is outside_ids)
    assert [record.failure_kind for record in records] == [None] * 12 and all(record.reward == 1.0 for record in records)
    broken, live = stats["replicas"]
    # new episodes spread by a hash while both look alike: with 12 of them, one reaches the bad replica
    assert broken["calls"] >= 1 and broken["errors"] == broken["calls"]
    assert broken["episodes"] == 1  # its first unusable answer took it out of routing: no new episode went there
    assert live["errors"] == 0 and len(set(good[0].episodes)) == len(CITIES)


def test_out_of_vocabulary_ids_fail_the_rollout_naming_the_replica_and_the_ids(smol_template) -> None:
    with bad_replica(outside_ids) as bad:
        records, stats = run([bad], smol_template, rows=_weather_rows()[:1])
    (record,) = records
    assert record.failure_kind == "infra" and record.mask_sample
    reason = record.failure_reason or ""
    assert f"{bad}: token ids outside the tokenizer's vocabulary [0, 49152): [{OUTSIDE}]" in reason
    assert stats["replicas"][0]["errors"] == stats["replicas"][0]["calls"] == 3  # max_retries=2: three attempts, all unusable


def test_eval_checks_a_replicas_ids_against_the_tokenizer_it_renders_with(tmp_path) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(_weather_rows()[0]) + "\n")
    with bad_replica(outside_ids) as bad:
        main(["eval", "--data", str(data), "--base-url", bad, "--no-progress", "--max-retries", "0",
              "--output", str(tmp_path / "out.jsonl")])
    (record,) = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert record["failure_kind"] == "infra" and f"{bad}: token ids outside" in record["failure_reason"]
    assert str(OUTSIDE) in record["failure_reason"]
