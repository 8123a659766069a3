"""`gym-bridge serve` end to end: `/run` throughput and latency with an instant scripted model behind it.

    .venv/bin/python benchmarks/agent_server.py [--rollouts 400] [--concurrency 1,16,64]

Each weather rollout is two chat calls with token ids to `serve-model`'s app (a scripted model that
answers at once) and one tool call: everything NeMo RL's multi-turn `/run` costs except generation,
an upper bound on the server's overhead since both servers and the client share one process (uvicorn
threads). Best of 2 runs per concurrency; the last line is JSON: `runs_per_s_c{C}`, `p50_ms_c{C}`, `p95_ms_c{C}`.
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

from gym_bridge.adapters.nemo_gym_server import AgentServerSettings, build_app  # noqa: E402
from gym_bridge.core.policy import Generation  # noqa: E402
from gym_bridge.core.registry import get_environment  # noqa: E402
from gym_bridge.policies.embedded import load_embedded_tokenizer  # noqa: E402
from gym_bridge.server import build_app as build_model_app  # noqa: E402
from tests.http_server import app_in_thread  # noqa: E402
from tests.scripted_model import ScriptedModel, by_turn  # noqa: E402

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Seattle"}}\n</tool_call>'


async def measure(url: str, row: dict, *, rollouts: int, concurrency: int) -> tuple[float, list[float]]:
    slots = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def one(client: httpx.AsyncClient, index: int) -> None:
        async with slots:
            started = time.perf_counter()
            answer = await client.post(url + "/run", json={**row, "_rowidx": index})
            latencies.append(time.perf_counter() - started)
            result = answer.json()
            if answer.status_code != 200 or result["failure_kind"] is not None or result["reward"] != 1.0:
                raise RuntimeError(f"unexpected /run answer: {answer.status_code} {answer.text[:300]}")

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        started = time.perf_counter()
        await asyncio.gather(*(one(client, i) for i in range(rollouts)))
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
                best_rate, best_latencies = 0.0, []
                for _ in range(2):
                    rate, latencies = asyncio.run(measure(agent_url, row, rollouts=args.rollouts, concurrency=concurrency))
                    if rate > best_rate:
                        best_rate, best_latencies = rate, latencies
                ordered = sorted(best_latencies)
                results[f"runs_per_s_c{concurrency}"] = round(best_rate, 1)
                results[f"p50_ms_c{concurrency}"] = round(1000 * statistics.median(ordered), 2)
                results[f"p95_ms_c{concurrency}"] = round(1000 * ordered[int(0.95 * (len(ordered) - 1))], 2)
                print(f"concurrency {concurrency}: {best_rate:.1f} /run per s, p50 {results[f'p50_ms_c{concurrency}']} ms", file=sys.stderr)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
