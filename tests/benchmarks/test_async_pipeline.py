"""benchmarks/async_pipeline.py measures what it says: a small run of each mode on its stub, every episode complete,
the summary JSON on the last line, gym_bridge's worker discarding nothing."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl.experimental.async_grpo", reason="needs TRL >= 1.16")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "async_pipeline.py"


@pytest.mark.slow  # about 20 s (a subprocess importing TRL); covered by default test:
# test_admission_keeps_every_row_within_max_staleness_through_trls_dataset (the worker's admission against TRL's drop rule)
def test_a_small_run_of_every_mode():
    result = subprocess.run([sys.executable, str(BENCH), "--rows", "32", "--repeats", "1", "--step-s", "0.1", "--tasks", "16"],
                            capture_output=True, text=True, timeout=300, check=True)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["simulation"] is True and set(report["modes"]) == {"sync", "async", "trl"}
    for mode, figures in report["modes"].items():
        assert figures["complete_episode_share"]["median"] == 1.0, mode  # the stub and both workers ran every episode out
        assert 0 <= figures["trainer_idle_share"]["median"] <= 1 and 0 <= figures["generator_idle_share"]["median"] <= 1
    assert report["modes"]["async"]["discarded_stale"]["max"] == 0
    assert report["modes"]["async"]["max_staleness_seen"]["max"] <= report["settings"]["max_staleness"]
    assert report["modes"]["sync"]["max_staleness_seen"]["max"] == 0
    limit = report["limit"]
    assert limit["limit_s"]["min"] >= max(limit["generation_full_concurrency_s"]["min"], limit["training_alone_s"]["min"])
    steps = 32 // report["settings"]["batch"]  # 2 steps of 0.1 s: training alone takes at least 0.2 s plus the syncs
    assert limit["training_alone_s"]["min"] >= steps * (0.1 + report["settings"]["sync_s"])
    for mode, figures in report["modes"].items():  # every mode trains every step; wall / limit is reported
        assert figures["wall_s"]["min"] >= 0.95 * limit["training_alone_s"]["min"], mode
        assert figures["wall_to_limit"]["median"] == pytest.approx(figures["wall_s"]["median"] / limit["limit_s"]["median"], rel=0.5)
    # a row's oldest token is never newer than the row's version
    assert report["modes"]["async"]["max_oldest_token_staleness"]["min"] >= report["modes"]["async"]["max_staleness_seen"]["min"]
    # where the trainer's wait went adds up to its idle share, and every long row gym_bridge's worker started is
    # trained, done and waiting, or still running when the row budget ends the run (none dropped)
    for mode, figures in report["modes"].items():
        waits = figures["first_step_wait_s"]["median"] + figures["later_steps_wait_s"]["median"]
        assert waits == pytest.approx(figures["trainer_idle_share"]["median"] * figures["wall_s"]["median"], abs=0.05), mode
        assert figures["long_rows_dropped_stale"]["max"] <= figures["discarded_stale"]["max"], mode
    worker = report["modes"]["async"]
    assert worker["long_rows_started"]["median"] == (worker["long_episodes_trained"]["median"] + worker["long_rows_waiting_at_end"]["median"]
                                                     + worker["long_rows_in_flight_at_end"]["median"])
