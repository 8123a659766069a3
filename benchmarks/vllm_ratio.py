"""P5: gym_bridge rollouts over the real vLLM engine against the same generation done by raw vLLM.

    .venv/bin/python benchmarks/vllm_ratio.py [--model PATH] [--tasks 16] [--repeats 2] [--rounds 3] [--served]

Colocated: one `vllm.LLM` in this process (its engine core in vLLM's own process, the default, so the
calling thread does not matter: gym_bridge calls `generate` from a worker thread, raw vLLM from the main one). Each round runs the tasks' rollouts through gym_bridge
(`Engine` + `VLLMEnginePolicy`, one model call each), then hands raw vLLM the same prompt ids with
`max_tokens` set to each rollout's sampled length and `ignore_eos` (the same tokens to generate, one
`LLM.generate` call). Served (`--served`): the same against `python -m vllm.entrypoints.openai.api_server`,
gym_bridge's `RemotePolicy` against a raw async client posting the same `/v1/completions` requests.
The ratio is raw time / gym_bridge time (1.0: no overhead), median and range over rounds; the
command's wall time, start-up included, is reported beside it. The same script runs on the CPU build
and on a GPU. The last line printed is the JSON result.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

START = time.perf_counter()
POLICY: dict[str, Any] = {}
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--tasks", type=int, default=16, help="arithmetic tasks per round")
    p.add_argument("--repeats", type=int, default=2, help="rollouts per task")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds (after one warm-up)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--served", action="store_true", help="also measure against a vLLM server")
    return p.parse_args()


def machine() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except ImportError:
        pass
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name"):
            return line.split(":", 1)[1].strip() + f" ({os.cpu_count()} cores)"
    return platform.processor()


def tasks_and_template(path: str, count: int) -> tuple[list[Any], Any]:
    from gym_bridge.core.template.chat_template import ChatTemplate
    from gym_bridge.eval.run import select_tasks
    from gym_bridge.policies.tokenizer import load_tokenizer

    loaded = load_tokenizer(path)
    return select_tasks(env_names=["arithmetic"], data_paths=[], limit=count), ChatTemplate(loaded.tokenizer, eos_token_ids=loaded.eos_token_ids)


async def gym_round(policy: Any, template: Any, tasks: list[Any], repeats: int, max_new_tokens: int, seed: int) -> tuple[float, list[Any]]:
    """(seconds, records) of one round of single-call rollouts through gym_bridge's engine."""
    from gym_bridge.core.agent_loop import Limits
    from gym_bridge.core.engine import Engine, EngineConfig
    from gym_bridge.core.policy import SamplingParams

    config = EngineConfig(sampling=SamplingParams(temperature=0.7, max_new_tokens=max_new_tokens, seed=seed), limits=Limits(max_turns=1))
    engine = Engine(policy, template, config)
    start = time.perf_counter()
    records = [record async for record in engine.stream(tasks, repeats=repeats)]
    elapsed = time.perf_counter() - start
    failed = [record.failure_reason for record in records if record.failure_kind]
    if failed:
        raise SystemExit(f"{len(failed)} rollouts failed; the first: {failed[0]}")
    return elapsed, records


def same_work(records: list[Any]) -> list[tuple[list[int], int]]:
    """(prompt ids, sampled length) of each rollout's one model call."""
    work = []
    for record in records:
        [call] = [item for item in record.output if "generation_token_ids" in item]
        work.append((list(call["prompt_token_ids"]), len(call["generation_token_ids"])))
    return work


def raw_engine_round(llm: Any, work: list[tuple[list[int], int]], seed: int) -> float:
    from vllm import SamplingParams

    params = [SamplingParams(temperature=0.7, max_tokens=length, ignore_eos=True, logprobs=0, seed=seed + i) for i, (_, length) in enumerate(work)]
    start = time.perf_counter()
    llm.generate([{"prompt_token_ids": ids} for ids, _ in work], params, use_tqdm=False)
    return time.perf_counter() - start


async def raw_server_round(base_url: str, model: str, work: list[tuple[list[int], int]], seed: int) -> float:
    import httpx

    async with httpx.AsyncClient(timeout=600.0, limits=httpx.Limits(max_connections=1024)) as client:
        async def one(i: int, ids: list[int], length: int) -> None:
            body = {"model": model, "prompt": ids, "max_tokens": length, "temperature": 0.7, "seed": seed + i, "logprobs": 0,
                    "ignore_eos": True, "return_token_ids": True}
            answer = await client.post(f"{base_url}/completions", json=body)
            answer.raise_for_status()

        start = time.perf_counter()
        await asyncio.gather(*(one(i, ids, length) for i, (ids, length) in enumerate(work)))
        return time.perf_counter() - start


def measure(name: str, gym: Any, raw: Any, rounds: int) -> dict[str, Any]:
    """Warm-up, then `rounds` of (gym_bridge, raw) on the same work; ratio = raw time / gym_bridge time."""
    gym(-1)
    ratios, gym_tps, raw_tps, calls = [], [], [], []
    for round_index in range(rounds):
        calls_before = getattr(POLICY.get("colocated"), "generate_calls", 0) if name == "colocated" else 0
        gym_s, records = gym(round_index)
        if name == "colocated":
            calls.append(POLICY["colocated"].generate_calls - calls_before)
        work = same_work(records)
        tokens = sum(length for _, length in work)
        raw_s = raw(work, round_index)
        ratios.append(raw_s / gym_s)
        gym_tps.append(tokens / gym_s)
        raw_tps.append(tokens / raw_s)
        print(f"{name} round {round_index}: {tokens} tokens, gym_bridge {gym_s:.2f} s, raw vLLM {raw_s:.2f} s, ratio {raw_s / gym_s:.3f}",
              file=sys.stderr)
    return {"ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "gym_bridge_tokens_per_s": statistics.median(gym_tps), "raw_tokens_per_s": statistics.median(raw_tps),
            **({"generate_calls_per_round": calls} if calls else {})}


def main() -> None:
    args = parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM

    from gym_bridge.policies.embedded import embedded_model_path
    from gym_bridge.policies.vllm_engine import VLLMEnginePolicy

    path = args.model or str(embedded_model_path())
    tasks, template = tasks_and_template(path, args.tasks)
    result: dict[str, Any] = {"machine": machine(), "model": Path(path).name, "rollouts_per_round": len(tasks) * args.repeats,
                              "rounds": args.rounds}
    llm = LLM(model=path, enforce_eager=True, seed=0, max_model_len=2048)
    policy = POLICY["colocated"] = VLLMEnginePolicy(llm)
    result["colocated"] = measure(
        "colocated",
        lambda r: asyncio.run(gym_round(policy, template, tasks, args.repeats, args.max_new_tokens, seed=1000 * (r + 1))),
        lambda work, r: raw_engine_round(llm, work, seed=1000 * (r + 1)),
        args.rounds,
    )
    if args.served:
        result["served"] = served(args, path, tasks, template)
    result["command_wall_s"] = time.perf_counter() - START
    print(json.dumps(result))


def served(args: argparse.Namespace, path: str, tasks: list[Any], template: Any) -> dict[str, Any]:
    from gym_bridge.policies.remote import RemotePolicy
    from tests.support.vllm_engine import start_vllm_server, stop

    log = Path(os.environ.get("TMPDIR", "/tmp")) / "vllm_ratio_server.log"
    process, base_url = start_vllm_server(log)
    try:
        def gym(r: int) -> tuple[float, list[Any]]:
            async def run() -> tuple[float, list[Any]]:
                policy = RemotePolicy([base_url], model="smol")
                try:
                    return await gym_round(policy, template, tasks, args.repeats, args.max_new_tokens, seed=1000 * (r + 1))
                finally:
                    await policy.aclose()

            return asyncio.run(run())

        return measure("served", gym, lambda work, r: asyncio.run(raw_server_round(base_url, "smol", work, seed=1000 * (r + 1))), args.rounds)
    finally:
        stop(process)


if __name__ == "__main__":
    main()
