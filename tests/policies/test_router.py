"""The replica router: an episode's calls stay on one replica, new episodes go to the least busy, a
dead replica's episodes fail over, and the counters say so. Real stub servers on loopback, no Ray."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from gym_bridge.cli import main
from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.policy import GenerationRequest, SamplingParams
from gym_bridge.core.errors import BackendError
from gym_bridge.core.task import parse_task
from gym_bridge.policies.remote import RemotePolicy
from gym_bridge.policies.http import ReplicaLostError
from gym_bridge.policies.router import ReplicaRouter, merge_stats
from tests.scale.stub_replicas import stub_replicas

CITIES = ["Paris", "Oslo", "Lima", "Cairo", "Quito", "Hanoi", "Dakar", "Perth", "Riga", "Sofia", "Tunis", "Accra"]


def _weather_rows() -> list[dict]:
    tool = {"type": "function", "name": "get_weather", "description": "Get the current weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    return [{"responses_create_params": {"input": [{"role": "user", "content": f"What is the weather in {city}?"}], "tools": [tool]},
             "environment": "weather"} for city in CITIES]


def test_episodes_stick_new_ones_go_to_the_least_busy_and_failover_counts_a_miss():
    router = ReplicaRouter(["http://a/v1", "http://b/v1"], down_for_s=60)
    first = router.choose("e1")
    router.started(first)  # e1's call is in flight on `first`
    second = router.choose("e2")
    assert second != first  # the least busy replica takes the new episode
    router.finished(first, ok=True)
    assert router.choose("e1") == first  # hit 1
    router.started(first)
    router.finished(first, ok=False, down=True)  # `first` stops answering: down for 60 s
    assert router.choose("e1") == second  # miss 1: failed over
    assert router.choose("e1") == second  # hit 2: e1 now lives on `second`
    stats = router.stats()
    assert (stats["affinity_hits"], stats["affinity_misses"], stats["affinity_hit_rate"]) == (2, 1, round(2 / 3, 4))
    assert [r["errors"] for r in stats["replicas"]][first] == 1
    merged = merge_stats([stats, stats])
    assert merged["affinity_hits"] == 4 and merged["replicas"][first]["calls"] == 4  # 2 calls on `first` per router, 2 routers


def _run(urls: list[str], smol_template, *, on_record=None, concurrency: int = 12, retry_reached_calls: bool = False):  # type: ignore[no-untyped-def]
    policy = RemotePolicy(urls, model="stub", request_timeout_s=10, max_retries=3, backoff_s=0.01, down_for_s=60,
                          retry_reached_calls=retry_reached_calls)
    engine = Engine(policy, smol_template, EngineConfig(max_concurrency=concurrency, model_name="stub"))

    async def run():  # type: ignore[no-untyped-def]
        records = []
        async for record in engine.stream([parse_task(row, index=i) for i, row in enumerate(_weather_rows())]):
            records.append(record)
            if on_record is not None:
                on_record(record)
        await policy.aclose()
        return records

    return asyncio.run(run()), policy.router.stats()


def test_every_call_of_an_episode_goes_to_one_replica_and_both_replicas_work(smol_template):
    with stub_replicas(2, delay_s=0.02) as replicas:
        records, stats = _run([replica.url for replica in replicas], smol_template)
    assert [record.failure_kind for record in records] == [None] * 12 and all(record.reward == 1.0 for record in records)
    where = {}
    for position, replica in enumerate(replicas):
        for episode in replica.episodes:
            where.setdefault(episode, set()).add(position)
    assert len(where) == 12 and all(len(places) == 1 for places in where.values())  # affinity, seen by the servers
    per_replica = Counter(next(iter(places)) for places in where.values())
    assert per_replica[0] == 6 and per_replica[1] == 6  # 12 concurrent new episodes balanced by in-flight load
    assert stats["affinity_hit_rate"] == 1.0 and stats["affinity_hits"] == 12  # each episode's second call found its replica


def _closed_port_url() -> str:
    """A loopback URL where nothing listens: connecting is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


@dataclass
class DroppingServer:
    url: str
    requests: int = 0
    """Whole requests read (each then dropped)."""


@contextmanager
def dropping_server() -> Iterator[DroppingServer]:
    """A loopback server that accepts each connection, reads one whole request and closes the socket
    without answering: a replica that dies while generating."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)
    server = DroppingServer(url=f"http://127.0.0.1:{listener.getsockname()[1]}/v1")
    stopping = threading.Event()

    def read_request(conn: socket.socket) -> bool:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return False
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = re.search(rb"content-length:\s*(\d+)", head, re.IGNORECASE)
        while length is not None and len(body) < int(length.group(1)):
            chunk = conn.recv(65536)
            if not chunk:
                return False
            body += chunk
        return True

    def serve() -> None:
        while not stopping.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                if read_request(conn):
                    server.requests += 1

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        stopping.set()
        thread.join(timeout=5)
        listener.close()


def _request(session_id: str) -> GenerationRequest:
    return GenerationRequest(prompt_ids=[1, 2, 3], sampling=SamplingParams(max_new_tokens=4), session_id=session_id)


def test_a_call_that_reached_a_server_which_then_dropped_it_is_not_retried_unless_asked():
    with dropping_server() as server:
        policy = RemotePolicy(server.url, model="m", request_timeout_s=5, max_retries=3, backoff_s=0.0)
        with pytest.raises(ReplicaLostError, match=f"{re.escape(server.url)}: the connection broke after the request was sent"):
            asyncio.run(policy.generate(_request("e1")))
        assert server.requests == 1  # read once, dropped, not sent again
        resend = RemotePolicy(server.url, model="m", request_timeout_s=5, max_retries=3, backoff_s=0.0, retry_reached_calls=True)
        with pytest.raises(BackendError, match="4 attempts failed") as raised:
            asyncio.run(resend.generate(_request("e1")))
        assert not isinstance(raised.value, ReplicaLostError) and server.requests == 1 + 4


def test_a_refused_call_is_retried_on_the_other_replica_and_the_rollouts_succeed(smol_template):
    refusing = _closed_port_url()
    with stub_replicas(1) as replicas:
        records, stats = _run([refusing, replicas[0].url], smol_template)
    assert [record.failure_kind for record in records] == [None] * 12 and all(record.reward == 1.0 for record in records)
    dead = stats["replicas"][0]
    assert dead["calls"] >= 1 and dead["errors"] == dead["calls"]  # the first wave's calls to it were refused...
    assert stats["affinity_misses"] >= 1  # ...and those episodes moved: counted
    assert sorted(set(replicas[0].episodes)) == sorted(f"What is the weather in {city}?" for city in CITIES)  # all served by the live one


def test_a_replica_that_drops_calls_mid_answer_fails_those_rollouts_as_infra_and_the_others_go_on(smol_template):
    with dropping_server() as dropping, stub_replicas(1) as replicas:
        records, stats = _run([dropping.url, replicas[0].url], smol_template, concurrency=4)
    failed = [record for record in records if record.failure_kind]
    assert 1 <= len(failed) == dropping.requests <= 4  # each call it read failed its rollout, none was sent twice
    for record in failed:
        assert record.failure_kind == "infra"
        assert f"{dropping.url}: the connection broke after the request was sent" in (record.failure_reason or "")
    succeeded = [record for record in records if not record.failure_kind]
    assert len(records) == 12 and all(record.reward == 1.0 for record in succeeded)
    served = set(replicas[0].episodes)
    assert all(record.task.row["responses_create_params"]["input"][0]["content"] in served for record in succeeded)
    assert stats["replicas"][0]["errors"] == dropping.requests  # then it was down: later episodes went to the live one


@pytest.mark.parametrize("retry_reached_calls", [False, True])
def test_a_replica_killed_mid_run_fails_over_and_its_errors_are_counted(smol_template, retry_reached_calls):
    with stub_replicas(2, delay_s=0.2) as replicas:
        killed = []

        def kill_first(record) -> None:  # type: ignore[no-untyped-def]
            if not killed:
                killed.append(True)
                replicas[0].stop()  # type: ignore[operator]

        # 12 episodes of 2 calls, 4 at a time: the first one finishes with both replicas up, then replica 0
        # goes away while episodes that live on it wait for their second call, and 8 episodes are still to start
        records, stats = _run([replica.url for replica in replicas], smol_template, on_record=kill_first, concurrency=4,
                              retry_reached_calls=retry_reached_calls)
    assert len(records) == 12 and {record.task.index for record in records} == set(range(12))
    failed = [record for record in records if record.failure_kind]
    if retry_reached_calls:
        assert failed == []  # the calls replica 0 was answering when it went were sent again to replica 1
    else:  # those calls fail their rollouts (at most the 4 in flight); every other episode goes on
        assert len(failed) <= 4 and all(record.failure_kind == "infra" for record in failed)
        assert all(f"{replicas[0].url}: the connection broke after the request was sent" in (record.failure_reason or "")
                   for record in failed)
    errors = stats["replicas"][0]["errors"]
    assert errors >= 1 and errors == stats["affinity_misses"] + len(failed)  # each error: a moved episode (a miss) or a failed one
    assert stats["replicas"][1]["calls"] > 12  # replica 1 took over replica 0's remaining calls


def test_eval_starts_on_the_live_replicas_and_says_which_is_dead(tmp_path, capsys):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in _weather_rows()[:4]))
    with stub_replicas(1) as replicas:
        dead = "http://127.0.0.1:9/v1"
        code = main(["eval", "--data", str(data), "--base-url", dead, "--base-url", replicas[0].url, "--no-progress",
                     "--output", str(tmp_path / "out.jsonl")])
    assert code == 0
    err = capsys.readouterr().err
    assert f"replica {dead} does not answer" in err and "starting on the 1 live one(s)" in err
    metrics = json.loads((tmp_path / "out.metrics.json").read_text())
    assert [r["url"] for r in metrics["replicas"]["replicas"]] == [replicas[0].url]
    assert metrics["replicas"]["replicas"][0]["episodes"] == 4


def test_eval_prints_a_line_per_replica_when_it_routes_over_several(tmp_path, capsys):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in _weather_rows()[:4]))
    with stub_replicas(2) as replicas:
        code = main(["eval", "--data", str(data), "--base-url", replicas[0].url, "--base-url", replicas[1].url,
                     "--no-progress", "--concurrency", "4", "--output", str(tmp_path / "out.jsonl")])
    assert code == 0
    out = capsys.readouterr().out
    stats = json.loads((tmp_path / "out.metrics.json").read_text())["replicas"]
    for entry in stats["replicas"]:
        assert (f"replica {entry['url']}: {entry['episodes']} episodes, {entry['calls']} calls, 0 errors, "
                f"peak {entry['peak_in_flight']} in flight") in out
    assert sum(entry["episodes"] for entry in stats["replicas"]) == 4
    assert "episode affinity: 100.0% of later calls found their episode's replica (0 moved)" in out
