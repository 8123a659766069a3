"""`benchmarks/engine_overhead.py`'s cases on two source trees, run by turns in one sitting, as paired ratios.

Each tree gets one long-lived worker process (its own `.venv/bin/python`, its own `gym_bridge` and its own copy of
`benchmarks/engine_overhead.py`), which loads the embedded tokenizer, warms up (200 rollouts of each case) and freezes
the objects alive out of garbage collection, as that benchmark does; every run starts with the template's prompt and
piece caches empty and after a full garbage collection. The controller then asks the workers for one run
each, by turns: pair k runs A then B when k is even and B then A when it is odd (so a drift in the machine's speed
does not favour either side), both workers pinned to the same core and never running at once. A pair's two runs are a
second or two apart, where separate benchmark processes are minutes apart; on a virtual machine whose speed drifts
by tens of percent from minute to minute, this is what makes a 5 % difference visible.

Cases (each a run of `--rollouts` rollouts, every one with its own prompt): `single` (one model turn, no tool call),
`multi` (five tool calls, six model turns), `multi-journal` (`multi` with each rollout committing its turns to a
journal on disk, fsynced, as `gym-bridge eval --journal` does). For each case: both trees' median rollouts/s with
min-max, the median of the per-pair ratios B/A with their min-max, and the CPU time per rollout. The last line
printed is JSON.

Run: `.venv/bin/python benchmarks/trees_ab.py --a /path/to/old/tree --b . --pairs 15` (each tree needs its
`.venv`; `git worktree add /tmp/old <commit>` and a link to this `.venv` make one). About 6 s per pair.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

CASES = ("single", "multi", "multi-journal")


def tree_bench(tree: Path, concurrency: int) -> tuple[Any, Any]:
    """`tree`'s own `benchmarks/engine_overhead.py` (run from `tree`, importing its `gym_bridge`) and its `Bench`,
    warmed up as that script warms up (200 rollouts of each case)."""
    import importlib.util

    os.chdir(tree)
    sys.path.insert(0, str(tree))
    spec = importlib.util.spec_from_file_location("engine_overhead_of_tree", tree / "benchmarks" / "engine_overhead.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    bench = module.Bench(concurrency)
    for case in ("single", "multi"):
        bench.run(case, 200, prompts="distinct")
    return module, bench


def worker(tree: Path, concurrency: int) -> None:
    """Serve runs for the controller: a line `CASE ROLLOUTS` in, a JSON line `{"wall_s", "cpu_s"}` out."""
    module, bench = tree_bench(tree, concurrency)
    module.freeze_startup_objects()
    print(json.dumps({"ready": str(tree)}), flush=True)
    with tempfile.TemporaryDirectory(prefix="trees-ab-") as temp:
        for number, line in enumerate(sys.stdin):
            case, rollouts = line.split()
            bench.template._prompt_cache.clear()
            pieces = getattr(bench.template.codec, "pieces", None)
            if pieces is not None:  # the tokenizer's piece caches start empty too: an older tree's could overflow in
                pieces._refresh()   # the middle of an encode after tens of thousands of distinct prompts (fixed since)
            gc.collect()  # every run starts with the collector in the same state (else a run that happens to hold
            # the one full collection of several runs is 5-10 % slower than its neighbours, whatever the tree)
            journal_dir = Path(temp) / f"run{number}" if case == "multi-journal" else None
            wall_s, cpu_s, records = bench.run("single" if case == "single" else "multi", int(rollouts), journal_dir=journal_dir)
            module.check(records, "single" if case == "single" else "multi")
            print(json.dumps({"wall_s": wall_s, "cpu_s": cpu_s}), flush=True)


class Worker:
    def __init__(self, tree: Path, concurrency: int, core: int | None) -> None:
        python = tree / ".venv" / "bin" / "python"
        command = [str(python), str(Path(__file__).resolve()), "--worker", str(tree), "--concurrency", str(concurrency)]
        if core is not None:
            command = ["taskset", "-c", str(core), *command]
        env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.tree = tree
        self.errors = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(command, cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.errors, text=True)
        self._read()

    def _read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                found: dict[str, Any] = json.loads(line)
                return found
        code = self.process.wait()
        self.errors.seek(0)
        raise SystemExit(f"the worker of {self.tree} stopped (exit {code}); its last words:\n{self.errors.read()[-3000:]}")

    def run(self, case: str, rollouts: int) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{case} {rollouts}\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)


def summary(rollouts: int, a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, Any]:
    def rate(runs: list[dict[str, Any]]) -> list[float]:
        return sorted(rollouts / run["wall_s"] for run in runs)

    ratios = sorted(run_a["wall_s"] / run_b["wall_s"] for run_a, run_b in zip(a, b))
    cpu_ratios = sorted(run_a["cpu_s"] / run_b["cpu_s"] for run_a, run_b in zip(a, b))
    return {
        "a_rollouts_per_s": round(statistics.median(rate(a)), 1), "a_min_max": [round(rate(a)[0], 1), round(rate(a)[-1], 1)],
        "b_rollouts_per_s": round(statistics.median(rate(b)), 1), "b_min_max": [round(rate(b)[0], 1), round(rate(b)[-1], 1)],
        "b_over_a_median": round(statistics.median(ratios), 3), "b_over_a_min_max": [round(ratios[0], 3), round(ratios[-1], 3)],
        "b_over_a_quartiles": [round(q, 3) for q in statistics.quantiles(ratios, n=4)] if len(ratios) > 1 else [],
        "cpu_us_per_rollout_a_b": [round(statistics.median(run["cpu_s"] for run in a) / rollouts * 1e6, 1),
                                   round(statistics.median(run["cpu_s"] for run in b) / rollouts * 1e6, 1)],
        "b_over_a_by_cpu_median": round(statistics.median(cpu_ratios), 3),
        "pairs": len(ratios),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--a", type=Path, help="the reference tree (ratios are B over A)")
    parser.add_argument("--b", type=Path, help="the tree measured against it")
    parser.add_argument("--pairs", type=int, default=15, help="runs of each case on each tree, by turns")
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--core", type=int, default=0, help="the CPU both workers are pinned to (-1: not pinned)")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker.resolve(), args.concurrency)
        return
    if args.a is None or args.b is None:
        parser.error("--a and --b name the two trees")
    cases = [case.strip() for case in args.cases.split(",") if case.strip()]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}: choose from {', '.join(CASES)}")
    core = None if args.core < 0 else args.core
    workers = {"a": Worker(args.a.resolve(), args.concurrency, core), "b": Worker(args.b.resolve(), args.concurrency, core)}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {case: {"a": [], "b": []} for case in cases}
    try:
        for pair in range(args.pairs):
            for case in cases:
                for side in ("a", "b") if pair % 2 == 0 else ("b", "a"):
                    runs[case][side].append(workers[side].run(case, args.rollouts))
            print(f"pair {pair + 1}/{args.pairs} done", file=sys.stderr, flush=True)
    finally:
        for each in workers.values():
            each.close()
    result: dict[str, Any] = {case: summary(args.rollouts, runs[case]["a"], runs[case]["b"]) for case in cases}
    result.update(a=str(args.a), b=str(args.b), rollouts=args.rollouts, load_avg_1m_at_end=round(os.getloadavg()[0], 2))
    for case in cases:
        found = result[case]
        print(f"{case:14s} A {found['a_rollouts_per_s']:8.1f}/s  B {found['b_rollouts_per_s']:8.1f}/s  "
              f"B/A median {found['b_over_a_median']:.3f} (min-max {found['b_over_a_min_max']}, quartiles "
              f"{found['b_over_a_quartiles']}; by CPU {found['b_over_a_by_cpu_median']:.3f})")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
