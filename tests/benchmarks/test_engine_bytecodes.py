"""benchmarks/engine_bytecodes.py counts what each case executes: more turns and a journal execute more."""

from __future__ import annotations

from pathlib import Path

from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def test_the_counts_grow_with_the_turns_and_the_journal(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    counter = load_script(ROOT / "benchmarks" / "engine_bytecodes.py")
    bench = load_script(ROOT / "benchmarks" / "engine_overhead.py").Bench(concurrency=4)
    for case in ("single", "multi"):  # warm, as the script does: the first rollouts build the template's plans
        bench.run(case, 8)
    totals = {case: sum(counter.count(bench, case, 2, tmp_path / case).values()) for case in counter.CASES}
    assert 0 < totals["single"] < totals["multi"] < totals["multi-journal"]
    by_function = counter.count(bench, "multi", 2, tmp_path / "again")
    assert any(name.startswith("gym_bridge/core/") for name in by_function)  # named relative to the tree
