"""benchmarks/async_pipeline.py measures what it says: a small run of each mode on its stub, every episode complete,
the summary JSON on the last line, gym_bridge's worker discarding nothing, no mode under the bound for training
exactly the started set; and that bound on small cases computed by hand."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.scripts import load_script

pytest.importorskip("trl.experimental.async_grpo", reason="needs TRL >= 1.16")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "async_pipeline.py"


def load_bench():
    return load_script(BENCH)


def test_the_bound_for_training_exactly_the_started_set_on_hand_computed_cases():
    bound = load_bench().trained_set_bound
    # rows done at 0.1, 0.2, 0.3, 1.0 s; 2 rows per step, b = 0.4 + 0.1 = 0.5 s: step 1 starts when 2 are done (0.2),
    # step 2 when all 4 are (1.0; after step 1 and its sync would be 0.7): wall 1.5, idle at least 1 - 2 x 0.5 / 1.5
    assert bound([0.3, 0.1, 1.0, 0.2], batch=2, step_s=0.4, sync_s=0.1) == {"wall_lower_bound_s": 1.5, "idle_lower_bound": 0.333}
    # training binds: step 2 waits for step 1 (0.1 + 0.5 = 0.6 > 0.2): wall 1.1, idle 1 - 1.0 / 1.1
    assert bound([0.1, 0.1, 0.2, 0.2], batch=2, step_s=0.4, sync_s=0.1) == {"wall_lower_bound_s": 1.1, "idle_lower_bound": 0.091}
    # one step of 4: it starts when the slowest is done, 2.0 s; busy 0.5 s of 2.5
    assert bound([2.0, 0.1, 0.1, 0.1], batch=4, step_s=0.4, sync_s=0.1) == {"wall_lower_bound_s": 2.5, "idle_lower_bound": 0.8}
    with pytest.raises(ValueError, match="3 rows do not fill steps of 2"):
        bound([0.1, 0.2, 0.3], batch=2, step_s=0.4, sync_s=0.1)


def test_the_bound_for_groups_started_in_order_under_the_staleness_window_on_a_hand_computed_case():
    bench = load_bench()
    # groups of 2 rows taking 0.1, 1.0 and 0.1 s, 2 rows a step, b = 0.5 s. With max_staleness 0 group g starts only
    # after g steps: group 1 at 0.6 (step 1 at 0.1 on group 0), done 1.6; step 2 on it 1.6-2.1; group 2 starts at 2.1,
    # done 2.2; step 3 2.2-2.7. Idle at least 1 - 3 x 0.5 / 2.7. Unconstrained, step 3 would start at 1.1 (wall 1.6).
    rows = [0.1, 0.1, 1.0, 1.0, 0.1, 0.1]
    assert bench.in_order_bound(rows, group=2, batch=2, step_s=0.4, sync_s=0.1, max_staleness=0) == {
        "wall_bound_in_order_s": 2.7, "idle_bound_in_order": 0.444}
    assert bench.trained_set_bound(rows, batch=2, step_s=0.4, sync_s=0.1)["wall_lower_bound_s"] == 1.6
    # a window of 3 steps never holds a group back here: the in-order bound is the unconstrained one
    assert bench.in_order_bound(rows, group=2, batch=2, step_s=0.4, sync_s=0.1, max_staleness=2)["wall_bound_in_order_s"] == 1.6


@pytest.mark.slow  # about 20 s (a subprocess importing TRL); covered by default test:
# test_admission_keeps_every_row_within_max_staleness_through_trls_dataset (the worker's admission against TRL's drop rule)
def test_a_small_run_of_every_mode():
    result = subprocess.run([sys.executable, str(BENCH), "--rows", "32", "--repeats", "1", "--step-s", "0.1", "--tasks", "16"],
                            capture_output=True, text=True, timeout=300, check=True)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["simulation"] is True and set(report["modes"]) == {"sync", "async", "trl"}
    for mode in ("sync", "async"):  # both train exactly the groups they start: the bound holds (TRL's drops rows)
        assert report["modes"][mode]["wall_to_bound"]["min"] >= 1.0, mode
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
