"""`gym-bridge eval --base-url` against an instant model server: what the remote path costs the client.

    .venv/bin/python benchmarks/remote_throughput.py [--weather 2000] [--multi-step 500] [--concurrency 128] [--repeats 3]

`benchmarks/stub_server.py` runs in its own process and answers `/v1/completions` in vLLM's shape
at once, deciding every turn from the prompt ids, so every rollout earns reward 1: `weather` makes
one tool call (2 model calls), `multi_step` three (4 model calls). The rows are in the NeMo Gym
example formats (environments/*/data/example.jsonl) but every prompt is distinct, as a user's data
is: nothing is served from gym_bridge's prompt cache. Each run is the real command in a
subprocess, `gym-bridge eval --data ROWS --base-url URL --concurrency C`, as a user types it;
the two workloads alternate `--repeats` times.

- rollouts/s: rollouts / the run's in-loop wall time (`wall_s` of its metrics file);
- client_cpu_ms_per_request: the eval process's CPU time over the run (`cpu_s`: templating,
  tools, verifiers, HTTP, record writing, all of it) / model calls made;
- http_client_cpu_ms_per_request: RemotePolicy alone, in this process, calling the stub with
  distinct 300-400-token prompts at the same concurrency (CPU time / requests; every call is a
  rollout's first, with the prompt echo: the dearer form);
- stub_cpu_ms_per_request: the stub server's CPU time over the run / model calls (it shares the
  machine: where client and stub together need more than the cores, the rates measure the box);
- ready_s: from starting the command to its first rollout (the output file is opened then);
- with --compare-http-stacks, http_stack_cpu_ms_per_request: the same request loop on httpx (default
  and concurrency-sized pools) and on aiohttp, which is how RemotePolicy's HTTP stack was chosen.
Medians over repeats, with min and max. The last line printed is JSON.

`--journal-ab N`: only the multi_step workload, N runs with `--no-journal` and N with `--journal` (each finished turn
committed to OUTPUT.journal/, fsynced), interleaved off/on; client CPU per rollout and rollouts/s of each, and the
paired slowdown (median, min-max).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CITIES = [
    "Seattle", "Tokyo", "Paris", "Nairobi", "Buenos Aires", "Oslo", "Cairo", "Lima", "Sydney", "Toronto", "Mumbai", "Berlin",
    "Madrid", "Rome", "Lagos", "Seoul", "Bangkok", "Hanoi", "Jakarta", "Manila", "Santiago", "Bogota", "Quito", "Havana",
    "Dublin", "Lisbon", "Vienna", "Prague", "Warsaw", "Helsinki", "Reykjavik", "Athens", "Istanbul", "Tehran", "Karachi",
    "Dhaka", "Kathmandu", "Ulaanbaatar", "Beijing", "Shanghai", "Taipei", "Osaka", "Auckland", "Wellington", "Perth",
    "Denver", "Chicago", "Boston", "Miami", "Phoenix", "Montreal", "Vancouver", "Anchorage", "Honolulu", "Mexico City",
    "Casablanca", "Dakar", "Accra", "Addis Ababa", "Kigali", "Cape Town", "Zanzibar", "Marrakesh", "Tunis", "Algiers",
    "Riyadh", "Doha", "Dubai", "Muscat", "Baku", "Tbilisi", "Yerevan", "Almaty", "Tashkent", "Bishkek", "Minsk", "Riga",
    "Vilnius", "Tallinn", "Krakow",
]
QUESTIONS = [
    "What is the weather in {city}?", "How's the weather in {city} right now?", "Should I bring a coat to {city} today?",
    "Tell me the current weather in {city}.", "Is it cold in {city} at the moment?", "Do I need an umbrella in {city}?",
    "What should I wear in {city} today?", "Check the weather for {city}, please.", "Is it sunny in {city}?",
    "I am flying to {city} tonight. What is the weather like?", "Any chance of snow in {city}?",
    "How warm is it in {city} this afternoon?", "Give me a weather report for {city}.", "Is it windy in {city}?",
    "Can I go for a run in {city} now?", "What are conditions like in {city}?", "Is it a good day for a picnic in {city}?",
    "Will I need sunscreen in {city}?", "What's the temperature in {city}?", "Describe the weather in {city} for me.",
    "My friend lives in {city}. Is the weather nice there?", "Should I cycle to work in {city} today?",
    "Weather check for {city}?", "Is it raining in {city}?", "Can you look up the weather in {city}?",
]
WORDS = [
    "Warm", "Hot", "Blazing", "Toasty", "Chilly", "Cold", "Freezing", "Icy", "Large", "Huge", "Giant", "Vast", "Quick",
    "Rapid", "Swift", "Fast", "Small", "Tiny", "Little", "Minute", "Happy", "Joyful", "Cheerful", "Merry", "Sad",
    "Gloomy", "Somber", "Bright", "Shiny", "Radiant", "Dark", "Dim", "Quiet", "Silent", "Loud", "Noisy",
]


def weather_rows(count: int) -> list[dict]:
    """`count` distinct rows in NeMo Gym's `example_single_tool_call` format."""
    template = json.loads((ROOT / "environments/weather/data/example.jsonl").read_text().splitlines()[0])
    pairs = list(itertools.product(QUESTIONS, CITIES))
    if count > len(pairs):
        raise SystemExit(f"at most {len(pairs)} distinct weather rows")
    rows = []
    for question, city in pairs[:count]:
        params = dict(template["responses_create_params"])
        params["input"] = [params["input"][0], {"role": "user", "content": question.format(city=city)}]
        rows.append({**template, "responses_create_params": params})
    return rows


def multi_step_rows(count: int) -> list[dict]:
    """`count` distinct rows in NeMo Gym's `example_multi_step` format, two synonyms each (3 tool calls)."""
    template = json.loads((ROOT / "environments/multi_step/data/example.jsonl").read_text().splitlines()[0])
    pairs = [(a, b) for a, b in itertools.permutations(WORDS, 2)]
    if count > len(pairs):
        raise SystemExit(f"at most {len(pairs)} distinct multi_step rows")
    rows = []
    for i, synonyms in enumerate(pairs[:count]):
        label = next(word for word in reversed(WORDS) if word not in synonyms)
        developer = (f"You extract values with tools. Call get_synonym_value once for each of these synonyms, in this order: "
                     f"{', '.join(synonyms)}. Then call extract_synonym_values with all the values you got, in the same order. "
                     f'Do not look up the word "{label}" itself.')
        params = dict(template["responses_create_params"])
        params["input"] = [{"role": "developer", "content": developer},
                           {"role": "user", "content": f'What are the values of the synonyms of "{label}"?'}]
        values = [sum(map(ord, word)) for word in synonyms]
        rows.append({**template, "id": i, "expected_synonyms": list(synonyms), "expected_synonym_values": values,
                     "minefield_label": label, "minefield_label_value": sum(map(ord, label)), "responses_create_params": params})
    return rows


def start_stub() -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([sys.executable, str(ROOT / "benchmarks/stub_server.py"), "--port", "0"], stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline() if process.stdout else ""
    if not line.startswith("serving "):
        process.kill()
        raise SystemExit(f"the stub server did not start: {line!r}")
    return process, line.split(" at ")[-1].strip()


def process_cpu_s(pid: int) -> float:
    """User plus system CPU seconds a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_eval(rows_path: Path, url: str, *, concurrency: int, output: Path, journal: bool | None = None) -> dict:
    """One `gym-bridge eval` command; returns its metrics plus `ready_s` and `command_s`."""
    for path in (output, output.with_name(output.stem + ".metrics.json")):
        path.unlink(missing_ok=True)
    command = [sys.executable, "-m", "gym_bridge.cli", "eval", "--data", str(rows_path), "--base-url", url,
               "--concurrency", str(concurrency), "--max-turns", "8", "--max-new-tokens", "256", "--temperature", "1.0",
               "--no-progress", "--output", str(output)]
    if journal is not None:
        command.append("--journal" if journal else "--no-journal")
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready_s = None
    while process.poll() is None:
        if ready_s is None and output.exists():
            ready_s = time.perf_counter() - started
        time.sleep(0.001)
    command_s = time.perf_counter() - started
    stdout, stderr = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"eval exited {process.returncode}:\n{stdout}\n{stderr}")
    metrics = json.loads(output.with_name(output.stem + ".metrics.json").read_text())
    return {**metrics, "ready_s": ready_s if ready_s is not None else command_s, "command_s": command_s}


def http_client_cost(url: str, prompts: list[list[int]], *, concurrency: int, requests: int) -> dict:
    """RemotePolicy alone against the stub: CPU ms and wall ms per request at `concurrency`."""
    from gym_bridge.core.policy import GenerationRequest, SamplingParams
    from gym_bridge.policies.remote import RemotePolicy

    policy = RemotePolicy(url, model="stub", request_timeout_s=60)
    sampling = SamplingParams(max_new_tokens=256)

    async def run() -> tuple[float, float]:
        slots = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with slots:
                await policy.generate(GenerationRequest(prompt_ids=prompts[i % len(prompts)], sampling=sampling, session_id=str(i)))

        await asyncio.gather(*(one(i) for i in range(min(requests, 256))))  # warm the pool
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(requests)))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        await policy.aclose()
        return cpu, wall

    cpu_s, wall_s = run_like_eval(run())
    return {"cpu_ms_per_request": 1000 * cpu_s / requests, "requests_per_s": requests / wall_s}


def run_like_eval(coroutine):  # type: ignore[no-untyped-def]
    """Run on the event loop `gym-bridge eval` runs on (uvloop's where it is installed)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coroutine)


def http_stack_costs(url: str, prompts: list[list[int]], *, concurrency: int, requests: int) -> dict:
    """Client CPU ms per `/completions` request of the HTTP stacks considered for RemotePolicy (same body,
    same JSON parsing, same concurrency): httpx with its default-sized pool and with a pool of
    `concurrency`, and aiohttp as RemotePolicy configures it."""
    import aiohttp
    import httpx
    import orjson

    def body(i: int) -> bytes:
        return orjson.dumps({"model": "stub", "prompt": prompts[i % len(prompts)], "max_tokens": 256, "logprobs": 0,
                             "return_tokens_as_token_ids": True})

    async def timed(post) -> float:  # type: ignore[no-untyped-def]
        slots = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with slots:
                orjson.loads(await post(body(i)))

        await asyncio.gather(*(one(i) for i in range(min(requests, 256))))
        cpu = time.process_time()
        await asyncio.gather(*(one(i) for i in range(requests)))
        return 1000 * (time.process_time() - cpu) / requests

    async def with_httpx(connections: int) -> float:
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(60.0, pool=None)) as client:
            async def post(data: bytes) -> bytes:
                return (await client.post(url + "/completions", content=data, headers={"Content-Type": "application/json"})).content
            return await timed(post)

    async def with_aiohttp() -> float:
        connector = aiohttp.TCPConnector(limit=1024, ssl=False)
        async with aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False) as session:
            async def post(data: bytes) -> bytes:
                async with session.post(url + "/completions", data=data, headers={"Content-Type": "application/json"}) as response:
                    return await response.read()
            return await timed(post)

    return {
        "httpx_pool_1024": round(run_like_eval(with_httpx(1024)), 3),
        f"httpx_pool_{concurrency}": round(run_like_eval(with_httpx(concurrency)), 3),
        "aiohttp": round(run_like_eval(with_aiohttp()), 3),
    }


def spread(values: list[float], digits: int = 3) -> dict:
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits), "max": round(max(values), digits)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weather", type=int, default=2000, help="distinct weather rows")
    parser.add_argument("--multi-step", type=int, default=500, help="distinct multi_step rows")
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--http-requests", type=int, default=4000, help="requests of the RemotePolicy-only measurement")
    parser.add_argument("--compare-http-stacks", action="store_true",
                        help="also measure the client CPU per request of httpx (two pool sizes) and aiohttp")
    parser.add_argument("--journal-ab", type=int, default=0, metavar="N",
                        help="only multi_step: N runs with the resume journal off and N on, interleaved")
    args = parser.parse_args()
    if args.journal_ab:
        print(json.dumps(journal_ab(args)))
        return

    load_at_start = os.getloadavg()[0]
    workdir = Path(tempfile.mkdtemp(prefix="gym_bridge_remote_bench_"))
    workloads = {"weather": (weather_rows(args.weather), 2), "multi_step": (multi_step_rows(args.multi_step), 4)}
    paths = {}
    for name, (rows, _) in workloads.items():
        paths[name] = workdir / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(row) + "\n" for row in rows))
    stub, url = start_stub()
    runs: dict[str, list[dict]] = {name: [] for name in workloads}
    try:
        for repeat in range(args.repeats):
            for name, (rows, calls) in workloads.items():
                stub_cpu_s = process_cpu_s(stub.pid)
                metrics = run_eval(paths[name], url, concurrency=args.concurrency, output=workdir / f"{name}_out.jsonl")
                metrics["stub_cpu_s"] = process_cpu_s(stub.pid) - stub_cpu_s
                if metrics["rollouts"] != len(rows) or metrics["failed"] or metrics["mean_reward"] != 1.0 or metrics["mean_turns"] != calls:
                    raise SystemExit(f"{name}: not every rollout earned reward 1 in {calls} model calls: "
                                     f"{ {key: metrics[key] for key in ('rollouts', 'failed', 'failures_by_kind', 'mean_reward', 'mean_turns')} }")
                metrics["requests"] = len(rows) * calls
                runs[name].append(metrics)
                print(f"{name} #{repeat + 1}: {len(rows)} rollouts in {metrics['wall_s']:.2f} s "
                      f"({len(rows) / metrics['wall_s']:.0f}/s), cpu {metrics['cpu_s']:.2f} s "
                      f"({1000 * metrics['cpu_s'] / metrics['requests']:.3f} ms/request), stub cpu {metrics['stub_cpu_s']:.2f} s, "
                      f"ready {metrics['ready_s']:.2f} s, "
                      f"command {metrics['command_s']:.2f} s, load {os.getloadavg()[0]:.2f}", file=sys.stderr)
        prompts = [[1000 + (7 * i + j) % 20000 for j in range(300 + i % 100)] for i in range(256)]  # distinct, 300-400 ids
        http = http_client_cost(url, prompts, concurrency=args.concurrency, requests=args.http_requests)
        stacks = http_stack_costs(url, prompts, concurrency=args.concurrency, requests=2000) if args.compare_http_stacks else None
    finally:
        stub.terminate()
        stub.wait(timeout=10)

    result: dict = {}
    for name, name_runs in runs.items():
        rates = [len(workloads[name][0]) / run["wall_s"] for run in name_runs]
        result[f"remote_{name}_rollouts_per_s"] = round(statistics.median(rates), 1)
        result[f"remote_{name}_rollouts_per_s_spread"] = spread(rates, 1)
        result[f"client_cpu_ms_per_request_{name}"] = spread([1000 * run["cpu_s"] / run["requests"] for run in name_runs])
        result[f"stub_cpu_ms_per_request_{name}"] = spread([1000 * run["stub_cpu_s"] / run["requests"] for run in name_runs])
    total_cpu = [sum(runs[name][i]["cpu_s"] for name in runs) for i in range(args.repeats)]
    total_requests = sum(runs[name][0]["requests"] for name in runs)
    result["client_cpu_ms_per_request"] = round(statistics.median(1000 * cpu / total_requests for cpu in total_cpu), 3)
    result["http_client_cpu_ms_per_request"] = round(http["cpu_ms_per_request"], 3)
    result["http_client_requests_per_s"] = round(http["requests_per_s"], 1)
    if stacks:
        result["http_stack_cpu_ms_per_request"] = stacks
    ready = [run["ready_s"] for name_runs in runs.values() for run in name_runs]
    result["ready_s"] = round(statistics.median(ready), 3)
    result["ready_s_spread"] = spread(ready)
    result["command_s_spread"] = {name: spread([run["command_s"] for run in name_runs]) for name, name_runs in runs.items()}
    result.update(concurrency=args.concurrency, weather_rollouts=args.weather, multi_step_rollouts=args.multi_step,
                  repeats=args.repeats, cpu_count=os.cpu_count() or 0, load_avg_1m_at_start=round(load_at_start, 2),
                  load_avg_1m_at_end=round(os.getloadavg()[0], 2))
    print(json.dumps(result))


def journal_ab(args: argparse.Namespace) -> dict:
    """multi_step over HTTP with the journal off and on, interleaved (off, on, off, on, ...)."""
    load_at_start = os.getloadavg()[0]
    workdir = Path(tempfile.mkdtemp(prefix="gym_bridge_journal_ab_"))
    rows = multi_step_rows(args.multi_step)
    path = workdir / "multi_step.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    stub, url = start_stub()
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    try:
        for repeat in range(args.journal_ab):
            for mode in ("off", "on"):
                metrics = run_eval(path, url, concurrency=args.concurrency, output=workdir / f"{mode}.jsonl", journal=mode == "on")
                if metrics["rollouts"] != len(rows) or metrics["failed"] or metrics["mean_turns"] != 4:
                    raise SystemExit(f"journal {mode}: not every rollout made its 4 model calls: {metrics}")
                if (workdir / f"{mode}.jsonl.journal").exists():
                    raise SystemExit("the journal of a finished run was not removed")
                runs[mode].append(metrics)
                print(f"journal {mode} #{repeat + 1}: {len(rows) / metrics['wall_s']:.0f} rollouts/s, "
                      f"cpu {1e6 * metrics['cpu_s'] / len(rows):.0f} us/rollout, load {os.getloadavg()[0]:.2f}", file=sys.stderr)
    finally:
        stub.terminate()
        stub.wait(timeout=10)
    rates = {mode: [len(rows) / run["wall_s"] for run in runs[mode]] for mode in runs}
    cpu = {mode: [1e6 * run["cpu_s"] / len(rows) for run in runs[mode]] for mode in runs}
    slowdown = sorted(100 * (off / on - 1) for off, on in zip(rates["off"], rates["on"]))
    cpu_paired = sorted(100 * (on / off - 1) for off, on in zip(cpu["off"], cpu["on"]))
    return {
        "journal_off_rollouts_per_s": spread(rates["off"], 1), "journal_on_rollouts_per_s": spread(rates["on"], 1),
        "journal_slowdown_median_pct": round(statistics.median(slowdown), 1),
        "journal_slowdown_min_max_pct": [round(slowdown[0], 1), round(slowdown[-1], 1)],
        "journal_client_cpu_us_per_rollout_off": spread(cpu["off"], 1), "journal_client_cpu_us_per_rollout_on": spread(cpu["on"], 1),
        "journal_cpu_overhead_median_pct": round(statistics.median(cpu_paired), 1),
        "journal_cpu_overhead_min_max_pct": [round(cpu_paired[0], 1), round(cpu_paired[-1], 1)],
        "journal_commits_per_rollout": 3, "concurrency": args.concurrency, "multi_step_rollouts": len(rows),
        "runs_each": args.journal_ab, "cpu_count": os.cpu_count() or 0, "load_avg_1m_at_start": round(load_at_start, 2),
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
    }


if __name__ == "__main__":
    main()
