"""benchmarks/trees_ab.py: two trees' workers run by turns, and the ratios say which tree is faster."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "trees_ab.py"


def test_the_ratios_are_b_over_a_in_rollouts_per_second():
    summary = load_script(SCRIPT).summary
    a = [{"wall_s": 2.0, "cpu_s": 2.0}, {"wall_s": 4.0, "cpu_s": 4.0}]
    b = [{"wall_s": 1.0, "cpu_s": 1.0}, {"wall_s": 4.0, "cpu_s": 2.0}]  # B twice as fast in the first pair, as fast in the second
    found = summary(10, a, b)
    assert found["b_over_a_min_max"] == [1.0, 2.0] and found["b_over_a_median"] == 1.5
    assert found["a_rollouts_per_s"] == 3.8 and found["b_rollouts_per_s"] == 6.2  # medians of 10/2, 10/4 and 10/1, 10/4
    assert found["b_over_a_by_cpu_median"] == 2.0 and found["pairs"] == 2


def test_one_pair_of_the_same_tree_runs_every_case_on_both_workers():
    done = subprocess.run([sys.executable, str(SCRIPT), "--a", str(ROOT), "--b", str(ROOT), "--pairs", "1", "--rollouts", "8"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for case in ("single", "multi", "multi-journal"):
        assert result[case]["pairs"] == 1 and result[case]["a_rollouts_per_s"] > 0 and result[case]["b_rollouts_per_s"] > 0


def test_an_unknown_case_is_refused_naming_the_choices():
    done = subprocess.run([sys.executable, str(SCRIPT), "--a", ".", "--b", ".", "--cases", "multi,triple"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "triple" in done.stderr and "multi-journal" in done.stderr
