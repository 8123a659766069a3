"""The async worker's admission with partial rollouts, simulated tick by tick with the real `CallClock` and
`StalenessWindow`: rows carrying their last call's version are never older than `max_staleness` when a trainer taking
them in push order reaches them, and a long episode holds the window back only until it calls under newer weights, so
the trainer waits less than with rows carrying their first call's version (step 1's contract)."""

import random

import pytest

from gym_bridge.core.staleness import StalenessWindow
from gym_bridge.trl._async.admission import CallClock


def simulate(row_version, *, max_staleness, rows_per_version, group_size=4, groups=120, seed=0):
    """Each rollout makes a long-tailed number of model calls of one tick each; the trainer takes one row per tick
    (its version moves on every `rows_per_version` rows). Returns each row's staleness when taken and the ticks the
    trainer found nothing to take while groups were left."""
    rng = random.Random(seed)
    now = {"version": 1}
    clock = CallClock(lambda: now["version"])
    window = StalenessWindow(max_staleness, rows_per_version, base_version=1)
    calls_left: dict[tuple[int, int], int] = {}
    first_call: dict[tuple[int, int], int] = {}
    queue: list[int] = []
    staleness, idle, taken, next_group = [], 0, 0, 0
    for _ in range(50_000):
        running = {key[0] for key in calls_left}
        if row_version == "last_call":
            for group in running:
                window.advance(group, min(clock.floor((group, repeat)) for repeat in range(group_size)))
        while next_group < groups and window.admits(group_size, now["version"]):
            window.admit(next_group, now["version"], group_size)
            length = min(int(rng.paretovariate(1.1)), 24)  # the same number of calls for the group's repeats
            for repeat in range(group_size):
                calls_left[(next_group, repeat)] = length
                first_call[(next_group, repeat)] = now["version"]
                clock.begin((next_group, repeat))
            next_group += 1
        for key in list(calls_left):  # every call in flight returns at the end of this tick
            clock.end(key)
            calls_left[key] -= 1
            if calls_left[key]:
                clock.begin(key)
                continue
            del calls_left[key]
            group = key[0]
            if not any(other[0] == group for other in calls_left):
                stamps = [clock.returned_at((group, r)) if row_version == "last_call" else first_call[(group, r)] for r in range(group_size)]
                queue += stamps
                window.finish(group, group_size)
                clock.forget(group, group_size)
        if queue:
            staleness.append(now["version"] - queue.pop(0))
            taken += 1
            if taken % rows_per_version == 0:
                now["version"] += 1
        elif next_group < groups:
            idle += 1
        if next_group == groups and not calls_left and not queue:
            return staleness, idle
    raise AssertionError("the simulation did not finish")


@pytest.mark.parametrize(("max_staleness", "rows_per_version"), [(1, 8), (2, 8), (4, 4)])
def test_rows_carrying_their_last_calls_version_are_never_too_stale_and_the_trainer_waits_less(max_staleness, rows_per_version):
    for seed in range(3):
        last, last_idle = simulate("last_call", max_staleness=max_staleness, rows_per_version=rows_per_version, seed=seed)
        first, first_idle = simulate("first_call", max_staleness=max_staleness, rows_per_version=rows_per_version, seed=seed)
        assert len(last) == len(first) == 120 * 4  # every row taken, none thrown away
        assert max(last) <= max_staleness and max(first) <= max_staleness
        assert last_idle < first_idle, (seed, last_idle, first_idle)


def test_a_rollouts_floor_is_the_version_its_next_row_can_carry():
    now = {"version": 3}
    woken = []
    clock = CallClock(lambda: now["version"], on_change=lambda: woken.append(now["version"]))
    assert clock.floor((0, 0)) == 3  # no call yet: its calls return under this version or a newer one
    clock.begin((0, 0))
    now["version"] = 4
    assert clock.floor((0, 0)) == 4  # a call in flight across a sync returns under the new version
    clock.end((0, 0))
    now["version"] = 5
    assert clock.floor((0, 0)) == 4 and clock.returned_at((0, 0)) == 4  # between calls: its last call's version
    clock.begin((0, 0))
    assert clock.floor((0, 0)) == 5 and woken == [5]  # its next call rose the floor: admission is woken
    clock.end((0, 0))
    clock.forget(0, group_size=1)
    assert clock.returned_at((0, 0)) is None


def test_the_window_only_raises_a_groups_bound():
    window = StalenessWindow(max_staleness=1, rows_per_version=4, base_version=1)
    window.admit(0, 1, 4)  # must be taken by row (1 - 1 + 2) * 4 = 8
    assert window.capacity(2) == 4
    window.advance(0, 2)  # its rows will carry version 2 or newer: by row 12
    assert window.capacity(2) == 8
    window.advance(0, 1)  # a lower version leaves it as it was
    assert window.capacity(2) == 8
