"""Rollouts past one process: the local engine against Ray workers, and replicas on a simulated cluster.

1. `cpu_verifier`: `weather` rollouts scored by a CPU-bound verifier (`--burn-ms` of hashing per
   rollout, under the GIL), generation by an instant scripted policy: rollouts/s of the local engine
   and of 1 and 2 Ray workers (a local Ray with one CPU per worker). One process cannot verify on two
   cores at once; two workers can.
2. `ray_overhead`: the same with a trivial verifier: what the Ray path adds per rollout (shipping
   the task and the record between processes) over the local engine, in ms.
3. `cluster`: Ray's multi-node test cluster on this machine (`ray.cluster_utils.Cluster`, one CPU per
   node) with `benchmarks/stub_server.py` replicas (each call waits `--stub-delay-s`, a model's time):
   throughput and the episode-affinity hit rate of multi-turn `multi_step` rollouts as replicas and
   workers grow.

Each figure is the median of `--repeats` runs, with min and max. Run (about 5 minutes on 2 cores):
    PYTHONPATH=$PWD .venv/bin/python benchmarks/scale.py
The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH")]))

from environments.weather import WeatherEnvironment  # noqa: E402
from gym_bridge import Engine, EngineConfig, Generation, ScriptedPolicy, VerifyResult  # noqa: E402
from gym_bridge.eval.run import select_tasks  # noqa: E402

BURN_MS = float(os.environ.get("GYM_BRIDGE_BURN_MS", "20"))
WEATHER_TURNS = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', "It is cold in Paris.")


class CpuVerifierWeather(WeatherEnvironment):
    """`weather` whose verifier also spends `GYM_BRIDGE_BURN_MS` of CPU (a math checker, a unit-test run)."""

    name = "weather_cpu_verifier"
    aliases = ()

    def verify(self, task, output):  # type: ignore[no-untyped-def]
        result = super().verify(task, output)
        deadline = time.thread_time() + BURN_MS / 1000
        digest = b"x"
        while time.thread_time() < deadline:
            digest = hashlib.sha256(digest).digest()
        return VerifyResult(reward=result.reward, metrics=result.metrics)


@dataclass(frozen=True)
class ScriptedEngine:
    """An engine whose policy answers every rollout instantly with the same two turns."""

    max_concurrency: int = 64

    def __call__(self) -> Engine:
        from gym_bridge.core.template.chat_template import ChatTemplate
        from gym_bridge.policies.embedded import load_embedded_tokenizer

        tokenizer = load_embedded_tokenizer()
        turns: list[Generation | BaseException] = []
        for text in WEATHER_TURNS:
            ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
            turns.append(Generation(token_ids=ids, logprobs=[-0.25] * len(ids), finish_reason="stop"))
        return Engine(ScriptedPolicy(script={"": turns}, record_calls=False), ChatTemplate(tokenizer),
                      EngineConfig(max_concurrency=self.max_concurrency, model_name="scripted"))


@dataclass(frozen=True)
class StubEngine:
    """An engine over stub replicas (`RemotePolicy` with the router)."""

    urls: tuple[str, ...]
    max_concurrency: int = 64

    def __call__(self) -> Engine:
        from gym_bridge.core.template.chat_template import ChatTemplate
        from gym_bridge.policies.embedded import load_embedded_tokenizer
        from gym_bridge.policies.remote import RemotePolicy

        return Engine(RemotePolicy(list(self.urls), model="stub"), ChatTemplate(load_embedded_tokenizer()),
                      EngineConfig(max_concurrency=self.max_concurrency, model_name="stub"))


def tasks_of(env_name: str, count: int, *, source_env: str = "weather"):  # type: ignore[no-untyped-def]
    base = select_tasks(env_names=[source_env])
    return [replace(base[i % len(base)], index=i, env_name=env_name) for i in range(count)]


def fresh(tasks, round_index: int):  # type: ignore[no-untyped-def]
    """The tasks with indices never used before (the scripted policy keeps a cursor per rollout id)."""
    return [replace(task, index=task.index + round_index * len(tasks)) for task in tasks]


def spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2), "max": round(max(values), 2)}


def time_local(tasks, repeats: int) -> list[float]:  # type: ignore[no-untyped-def]
    engine = ScriptedEngine()()
    rates = []
    for round_index in range(repeats + 1):
        started = time.perf_counter()
        records = asyncio.run(engine.run_groups(fresh(tasks, round_index), group_size=1))
        rates.append(len(records) / (time.perf_counter() - started))
        assert all(not group[0].failed for group in records), records[0][0].failure_reason
    return rates[1:]  # the first run warms the template's caches


def time_ray(tasks, workers: int, repeats: int, *, factory=None) -> tuple[list[float], float, dict]:  # type: ignore[no-untyped-def]
    from gym_bridge.scale.ray_runner import RayRollouts
    from gym_bridge.scale.ray_cluster import RayOptions

    rollouts = RayRollouts(factory or ScriptedEngine(), RayOptions(num_workers=workers), max_concurrency=64 * workers,
                           report=lambda line: None)
    started = time.perf_counter()
    rollouts.start(tasks[:1])
    start_s = time.perf_counter() - started
    rates = []
    try:
        for round_index in range(repeats + 1):
            started = time.perf_counter()
            records = asyncio.run(rollouts.run_groups(fresh(tasks, round_index), group_size=1))
            rates.append(len(records) / (time.perf_counter() - started))
            assert all(not group[0].failed for group in records), records[0][0].failure_reason
        stats = rollouts.replica_stats()
    finally:
        rollouts.shutdown()
    return rates[1:], start_s, stats


def one_machine(args: argparse.Namespace) -> dict:
    import ray

    ray.init(address="local", num_cpus=2, object_store_memory=100 * 1024**2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"], "HF_HUB_OFFLINE": "1", "GYM_BRIDGE_BURN_MS": str(BURN_MS)}})
    try:
        results: dict = {}
        busy = tasks_of("scale:CpuVerifierWeather", args.rollouts)
        local = time_local(busy, args.repeats)
        one, start_1, _ = time_ray(busy, 1, args.repeats)
        two, start_2, _ = time_ray(busy, 2, args.repeats)
        results["cpu_verifier"] = {
            "burn_ms": BURN_MS, "rollouts": len(busy),
            "local_rollouts_per_s": spread(local), "ray_1_worker_rollouts_per_s": spread(one), "ray_2_workers_rollouts_per_s": spread(two),
            "speedup_2_workers_vs_local": round(statistics.median(two) / statistics.median(local), 2),
            "worker_start_s": {"1": round(start_1, 1), "2": round(start_2, 1)},
        }
        plain = tasks_of("weather", args.rollouts)
        local = time_local(plain, args.repeats)
        one, _, _ = time_ray(plain, 1, args.repeats)
        results["ray_overhead"] = {
            "rollouts": len(plain), "local_rollouts_per_s": spread(local), "ray_1_worker_rollouts_per_s": spread(one),
            "overhead_ms_per_rollout": round(1000 / statistics.median(one) - 1000 / statistics.median(local), 3),
        }
        return results
    finally:
        ray.shutdown()


def start_stubs(count: int, delay_s: float) -> tuple[list[subprocess.Popen], list[str]]:
    processes, urls = [], []
    for _ in range(count):
        process = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "stub_server.py"), "--delay-s", str(delay_s)],
                                   stdout=subprocess.PIPE, text=True)
        line = process.stdout.readline().strip() if process.stdout else ""
        if not line.startswith("serving stub at "):
            raise SystemExit(f"stub server did not start: {line!r}")
        processes.append(process)
        urls.append(line.removeprefix("serving stub at "))
    return processes, urls


def cluster(args: argparse.Namespace) -> dict:
    import ray
    from ray.cluster_utils import Cluster

    nodes = max(args.cluster_sizes)
    simulated = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                              "object_store_memory": 80 * 1024**2})
    for _ in range(nodes - 1):
        simulated.add_node(num_cpus=1, object_store_memory=80 * 1024**2)
    ray.init(address=simulated.address, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"], "HF_HUB_OFFLINE": "1"}})
    stubs, urls = start_stubs(nodes, args.stub_delay_s)
    rows = []
    try:
        tasks = tasks_of("multi_step", args.cluster_rollouts, source_env="multi_step")
        for size in args.cluster_sizes:
            rates, _, stats = time_ray(tasks, size, args.repeats, factory=StubEngine(tuple(urls[:size])))
            rows.append({"nodes_used": size, "replicas": size, "workers": size, "rollouts_per_s": spread(rates),
                         "affinity_hit_rate": stats.get("affinity_hit_rate"),
                         "calls_per_replica": [entry["calls"] for entry in stats.get("replicas", [])]})
    finally:
        for process in stubs:
            process.terminate()
        ray.shutdown()
        simulated.shutdown()
    return {"cluster_nodes": nodes, "stub_delay_s": args.stub_delay_s, "rollouts": args.cluster_rollouts, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=96)
    parser.add_argument("--cluster-rollouts", type=int, default=48)
    parser.add_argument("--cluster-sizes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--stub-delay-s", type=float, default=0.05)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-cluster", action="store_true")
    args = parser.parse_args()
    machine = subprocess.run("lscpu | grep 'Model name'", shell=True, capture_output=True, text=True).stdout.split(":")[-1].strip()
    results = {"machine": machine, "cpus": os.cpu_count(), "load_avg_1m_at_start": round(os.getloadavg()[0], 2)}
    results.update(one_machine(args))
    print(json.dumps(results), flush=True)
    if not args.skip_cluster:
        results["cluster"] = cluster(args)
    results["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
