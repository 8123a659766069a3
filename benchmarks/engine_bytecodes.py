"""Python bytecodes executed per rollout in `benchmarks/engine_overhead.py`'s cases: what machine load cannot move.

A `sys.settrace` opcode counter runs around `--rollouts` rollouts of each case (after the benchmark's own warm-up),
each with its own prompt: `single` (one model turn), `multi` (five tool calls), `multi-journal` (`multi` committing
its turns to a journal, fsynced). Prints the bytecodes per rollout of each case and, with `--top N`, the N functions
that executed most of them (per rollout). Run it in each tree to compare (`PYTHONPATH=<tree>`, from the tree's root);
tracing makes it slow (about a minute). The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

CASES = ("single", "multi", "multi-journal")


def count(bench: Any, case: str, rollouts: int, journal_dir: Path) -> collections.Counter[str]:
    """Bytecodes executed during one run of `case`, by function (`file:name`, paths relative to the tree)."""
    counts: collections.Counter[str] = collections.Counter()
    root = os.getcwd() + "/"

    def enter(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        code = frame.f_code
        key = f"{code.co_filename.replace(root, '').split('site-packages/')[-1]}:{code.co_name}"

        def step(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "opcode":
                counts[key] += 1
            return step
        return step

    bench.template._prompt_cache.clear()
    sys.settrace(enter)
    try:
        bench.run("single" if case == "single" else "multi", rollouts,
                  journal_dir=journal_dir if case == "multi-journal" else None)
    finally:
        sys.settrace(None)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rollouts", type=int, default=100)
    parser.add_argument("--top", type=int, default=0, help="also the N functions that executed the most bytecodes")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # this script's folder: trees_ab beside it
    from trees_ab import tree_bench

    _, bench = tree_bench(Path.cwd(), 256)  # the tree run from: its engine_overhead.py and gym_bridge
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="engine-bytecodes-") as temp:
        for number, case in enumerate(CASES):
            counts = count(bench, case, args.rollouts, Path(temp) / f"run{number}")
            result[f"{case}_bytecodes_per_rollout"] = round(sum(counts.values()) / args.rollouts, 1)
            if args.top:
                result[f"{case}_top"] = {name: round(n / args.rollouts, 1) for name, n in counts.most_common(args.top)}
            print(f"{case:14s} {result[f'{case}_bytecodes_per_rollout']:10,.1f} bytecodes per rollout", file=sys.stderr)
    result["rollouts"] = args.rollouts
    print(json.dumps(result))


if __name__ == "__main__":
    main()
