"""`gym-bridge serve` end to end: `/run` throughput and latency with an instant scripted model behind it.

    .venv/bin/python benchmarks/agent_server.py [--rollouts 400] [--concurrency 1,16,64]

Each weather rollout is two chat calls with token ids to `serve-model`'s app (a scripted model that
answers at once) and one tool call: everything NeMo RL's multi-turn `/run` costs except generation,
an upper bound on the server's overhead since both servers and the client share one process (uvicorn
threads). Every /run carries a distinct prompt (the row's question with its own number), as real data
does. Three runs per concurrency: the last line is JSON with the medians `runs_per_s_c{C}`,
`p50_ms_c{C}`, `p95_ms_c{C}` and `runs_per_s_c{C}_min`/`_max` over the runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from gym_bridge.serve.agent_server import AgentServerSettings, build_app  # noqa: E402
from gym_bridge.core.policy import Generation  # noqa: E402
from gym_bridge.core.registry import get_environment  # noqa: E402
from gym_bridge.policies.embedded import load_embedded_tokenizer  # noqa: E402
from gym_bridge.serve.model_server import build_app as build_model_app  # noqa: E402
from tests.support.http_server import app_in_thread  # noqa: E402
from tests.support.scripted_model import ScriptedModel, by_turn  # noqa: E402

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Seattle"}}\n</tool_call>'


def distinct(row: dict, index: int) -> dict:
    """The row with its user question numbered: no two /run bodies render the same prompt."""
    params = dict(row["responses_create_params"])
    params["input"] = [
        {**message, "content": f"{message['content']} (request {index})"} if message["role"] == "user" else message
        for message in params["input"]
    ]
    return {**row, "responses_create_params": params, "_rowidx": index}


async def measure(url: str, row: dict, *, rollouts: int, concurrency: int, offset: int = 0) -> tuple[float, list[float]]:
    slots = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def one(client: httpx.AsyncClient, index: int) -> None:
        async with slots:
            started = time.perf_counter()
            answer = await client.post(url + "/run", json=distinct(row, index))
            latencies.append(time.perf_counter() - started)
            result = answer.json()
            if answer.status_code != 200 or result["failure_kind"] is not None or result["reward"] != 1.0:
                raise RuntimeError(f"unexpected /run answer: {answer.status_code} {answer.text[:300]}")

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        started = time.perf_counter()
        await asyncio.gather(*(one(client, offset + i) for i in range(rollouts)))
        wall = time.perf_counter() - started
    return rollouts / wall, latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=400)
    parser.add_argument("--concurrency", default="1,16,64")
    args = parser.parse_args()
    tokenizer = load_embedded_tokenizer()

    def turn(text: str) -> Generation:
        ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        return Generation(token_ids=ids, logprobs=[-0.1] * len(ids), finish_reason="stop")

    model = ScriptedModel(tokenizer, by_turn(turn(CALL), turn("It is cold in Seattle.")))
    model.requests = type("NoList", (), {"append": staticmethod(lambda request: None)})()  # keep nothing
    row = json.loads(get_environment("weather").example_data.read_text().splitlines()[0])
    row["responses_create_params"].update(temperature=1.0, top_p=1.0, max_output_tokens=64)
    row["agent_ref"]["name"] = "weather"
    results: dict[str, float] = {}
    with app_in_thread(build_model_app(model, model_name="scripted")) as model_url:
        settings = AgentServerSettings(envs=("weather",), model_base_urls=(model_url + "/v1",), model="scripted")
        with app_in_thread(build_app(settings)) as agent_url:
            asyncio.run(measure(agent_url, row, rollouts=20, concurrency=4))  # warm up
            for concurrency in (int(c) for c in args.concurrency.split(",")):
                runs = [
                    asyncio.run(measure(agent_url, row, rollouts=args.rollouts, concurrency=concurrency, offset=(run + 1) * args.rollouts))
                    for run in range(3)
                ]
                rates = [rate for rate, _ in runs]
                results[f"runs_per_s_c{concurrency}"] = round(statistics.median(rates), 1)
                results[f"runs_per_s_c{concurrency}_min"] = round(min(rates), 1)
                results[f"runs_per_s_c{concurrency}_max"] = round(max(rates), 1)
                p50s = [statistics.median(latencies) for _, latencies in runs]
                p95s = [sorted(latencies)[int(0.95 * (len(latencies) - 1))] for _, latencies in runs]
                results[f"p50_ms_c{concurrency}"] = round(1000 * statistics.median(p50s), 2)
                results[f"p95_ms_c{concurrency}"] = round(1000 * statistics.median(p95s), 2)
                print(f"concurrency {concurrency}: {results[f'runs_per_s_c{concurrency}']:.1f} /run per s, p50 {results[f'p50_ms_c{concurrency}']} ms", file=sys.stderr)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
