"""BFCL multi-turn through gym_bridge against BFCL's own generation loop, both on one OpenAI-compatible model server.

    .venv/bin/python benchmarks/bfcl_throughput.py [--entries 4] [--repeats 3] [--concurrency 4] [--max-tokens 64] [--first 0]

One `gym-bridge serve-model` process (the embedded SmolLM2-135M-Instruct) serves both sides. gym_bridge: `gym-bridge
eval --base-url` on rows of `gym-bridge data prepare bfcl --task multi_turn_base` (token ids over /v1/completions; BFCL's
backends in the BFCL worker). BFCL: its runner's own per-entry step (`multi_threaded_inference` with its
`OpenAICompletionsHandler` in function-calling mode, `OPENAI_BASE_URL` at the server; /v1/chat/completions) in
`.venv-bfcl`, in a thread pool of `--concurrency` as its runner's `--num-threads`. Both greedy, at most `--max-tokens`
per model call (BFCL's handler sends no limit: here its request gets `max_tokens`, its loop is unchanged). Runs
alternate gym_bridge, BFCL, gym_bridge, BFCL..., every run on entries no run had before (`--same-entries`: the two
runs of a repeat on the same entries, so their calls per entry compare), timed from the first model call to the last
(process start-up left out). Per run: entries/s, model calls/s, completion tokens/s and each entry's model calls; the
ratios are of the medians over the repeats (with min and max). The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BFCL_PYTHON = ROOT / ".venv-bfcl" / "bin" / "python"
CATEGORY = "multi_turn_base"


def bfcl_side(ids: list[str], *, base_url: str, model: str, concurrency: int, max_tokens: int) -> dict[str, Any]:
    """Run in `.venv-bfcl`: BFCL's own inference of the entries `ids` against `base_url`; its counts and wall time."""
    os.environ["OPENAI_BASE_URL"] = base_url
    os.environ.setdefault("OPENAI_API_KEY", "unused")
    from concurrent.futures import ThreadPoolExecutor

    from bfcl_eval._llm_response_generation import multi_threaded_inference
    from bfcl_eval.model_handler.api_inference.openai_completion import OpenAICompletionsHandler
    from bfcl_eval.utils import load_dataset_entry

    class LimitedHandler(OpenAICompletionsHandler):
        def generate_with_backoff(self, **kwargs: Any) -> Any:
            return super().generate_with_backoff(max_tokens=max_tokens, **kwargs)

    wanted = set(ids)
    entries = [entry for entry in load_dataset_entry(CATEGORY) if entry["id"] in wanted]
    handler = LimitedHandler(model_name=model, temperature=0.0, registry_name=f"{model}-FC", is_fc_model=True)
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(lambda entry: multi_threaded_inference(handler, entry, False, True), entries))
    wall_s = time.perf_counter() - started
    tokens = errors = 0
    calls_per_entry = []
    for result in results:
        if not isinstance(result.get("result"), list):
            errors += 1
        calls_per_entry.append(0)
        for turn in result.get("output_token_count") or []:
            turn = turn if isinstance(turn, list) else [turn]
            calls_per_entry[-1] += len(turn)
            tokens += int(sum(turn))
    return {"entries": len(entries), "wall_s": wall_s, "model_calls": sum(calls_per_entry), "completion_tokens": tokens, "errors": errors,
            "calls_per_entry": calls_per_entry}


def start_server() -> tuple[subprocess.Popen[str], str]:
    """`gym-bridge serve-model` on a free port; its process and base URL (`.../v1`)."""
    process = subprocess.Popen([sys.executable, "-m", "gym_bridge.cli", "serve-model", "--port", "0"], cwd=ROOT,
                               stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline() if process.stdout else ""
    if not line.startswith("serving "):
        process.kill()
        raise SystemExit(f"serve-model did not start: {line!r}")
    return process, line.split(" at ")[-1].strip()


def served_model(url: str, wait_s: float = 120.0) -> str:
    """The server's model name, once it answers `/models` (its `serving` line can come just before it accepts)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with urllib.request.urlopen(url + "/models", timeout=30) as answer:
                name: str = json.loads(answer.read())["data"][0]["id"]
                return name
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def run_gym_bridge(rows: list[dict[str, Any]], url: str, *, concurrency: int, max_tokens: int, work: Path) -> dict[str, Any]:
    """One `gym-bridge eval` over `rows`; its counts and in-loop wall time (`wall_s` of its metrics file)."""
    data, output = work / "rows.jsonl", work / "records.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    for path in (output, output.with_name(output.stem + ".metrics.json")):
        path.unlink(missing_ok=True)
    command = [sys.executable, "-m", "gym_bridge.cli", "eval", "--data", str(data), "--base-url", url, "--concurrency",
               str(concurrency), "--temperature", "0", "--max-new-tokens", str(max_tokens), "--max-turns", "1000",
               "--max-completion-tokens", "7000", "--deadline-s", "7200", "--no-progress", "--no-journal", "--output", str(output)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"gym-bridge eval exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    metrics = json.loads(output.with_name(output.stem + ".metrics.json").read_text())
    records = [json.loads(line) for line in output.read_text().splitlines()]
    tokens = sum(sum(record["tokens"]["completion_mask"]) for record in records if record.get("tokens"))
    calls_per_entry = [record["metrics"]["turns"] for record in records]
    return {"entries": len(records), "wall_s": metrics["wall_s"], "model_calls": sum(calls_per_entry), "completion_tokens": tokens,
            "errors": sum(record["failure_kind"] is not None for record in records), "calls_per_entry": calls_per_entry,
            "finish_reasons": [record["metrics"]["finish_reason"] for record in records]}


def run_bfcl(ids: list[str], url: str, *, concurrency: int, max_tokens: int, model: str) -> dict[str, Any]:
    """This file's `--bfcl-side` mode in `.venv-bfcl` (BFCL's pins conflict with gym_bridge's venv)."""
    command = [str(BFCL_PYTHON), str(Path(__file__).resolve()), "--bfcl-side", "--ids", ",".join(ids), "--base-url", url,
               "--model", model, "--concurrency", str(concurrency), "--max-tokens", str(max_tokens)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
    if done.returncode != 0:
        raise SystemExit(f"the BFCL side exited {done.returncode}:\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=4, help="BFCL entries per run (each run gets new ones)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side, interleaved")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per model call at most, both sides")
    parser.add_argument("--first", type=int, default=0, help="skip this many entries (another invocation, other entries)")
    parser.add_argument("--same-entries", action="store_true", help="both sides of a repeat run the same entries (calls per entry compare)")
    parser.add_argument("--bfcl-side", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ids", default="", help=argparse.SUPPRESS)
    parser.add_argument("--base-url", default="", help=argparse.SUPPRESS)
    parser.add_argument("--model", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bfcl_side:
        print(json.dumps(bfcl_side(args.ids.split(","), base_url=args.base_url, model=args.model, concurrency=args.concurrency,
                                   max_tokens=args.max_tokens)))
        return
    if not BFCL_PYTHON.exists():
        raise SystemExit("BFCL's side runs in .venv-bfcl: make install-bfcl")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(ROOT))
    from environments.bfcl import prepare_bfcl_rows

    sides = 1 if args.same_entries else 2
    needed = sides * args.repeats * args.entries
    rows = prepare_bfcl_rows(size=args.first + needed, task=CATEGORY)[args.first:]
    if len(rows) < needed:
        raise SystemExit(f"{CATEGORY} has {len(rows)} entries; --first + --entries x --repeats x {sides} must not exceed it")
    server, url = start_server()
    runs: dict[str, list[dict[str, Any]]] = {"gym_bridge": [], "bfcl": []}
    try:
        model = served_model(url)
        with tempfile.TemporaryDirectory() as work:
            for repeat in range(args.repeats):
                for side_index, side in enumerate(runs):
                    start = (sides * repeat + (side_index if sides == 2 else 0)) * args.entries
                    chunk = rows[start:start + args.entries]
                    if side == "gym_bridge":
                        run = run_gym_bridge(chunk, url, concurrency=args.concurrency, max_tokens=args.max_tokens, work=Path(work))
                    else:
                        run = run_bfcl([row["bfcl"]["id"] for row in chunk], url, concurrency=args.concurrency,
                                       max_tokens=args.max_tokens, model=model)
                    runs[side].append(run)
                    print(f"{side} #{repeat + 1}: {run['entries']} entries in {run['wall_s']:.1f} s, {run['model_calls']} model calls, "
                          f"{run['completion_tokens']} completion tokens, {run['errors']} failed, calls per entry {run['calls_per_entry']}", flush=True)
    finally:
        server.terminate()
        server.wait()
    summary: dict[str, Any] = {"category": CATEGORY, "entries_per_run": args.entries, "repeats": args.repeats,
                               "concurrency": args.concurrency, "max_tokens": args.max_tokens, "same_entries": args.same_entries}
    for side, side_runs in runs.items():
        for rate in ("entries", "model_calls", "completion_tokens"):
            summary[f"{side}_{rate}_per_s"] = spread([run[rate] / run["wall_s"] for run in side_runs])
    for side, side_runs in runs.items():
        summary[f"{side}_s_per_model_call"] = spread([run["wall_s"] / max(run["model_calls"], 1) for run in side_runs])
        summary[f"{side}_runs"] = side_runs
    for rate in ("entries", "model_calls", "completion_tokens"):
        summary[f"ratio_{rate}_per_s"] = summary[f"gym_bridge_{rate}_per_s"]["median"] / summary[f"bfcl_{rate}_per_s"]["median"]
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
