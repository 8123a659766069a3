"""The staleness window, simulated: a trainer that takes rows in push order and bumps its version every
`rows_per_version` rows never meets a row older than `max_staleness`, however long-tailed the episodes."""

import random

import pytest

from gym_bridge.core.staleness import StalenessWindow


def simulate(max_staleness, rows_per_version, group_size, seed, groups=300):
    """Discrete events: each admitted group finishes after a long-tailed number of ticks; the trainer takes one row
    per tick when one is queued. As the worker does, a group is admitted anyway when nothing runs and nothing is
    queued (the trainer could only wait). Returns the staleness of every row taken, the groups admitted and how
    many were forced."""
    rng = random.Random(seed)
    window = StalenessWindow(max_staleness, rows_per_version, base_version=1)
    version, taken, queue, running, staleness = 1, 0, [], {}, []
    next_group = forced = 0
    for tick in range(20_000):
        if next_group < groups and not running and not queue and not window.admits(group_size, version):
            forced += 1
            window.admit(next_group, version, group_size)
            running[next_group] = (tick + int(rng.paretovariate(1.2)), version)
            next_group += 1
        while next_group < groups and window.admits(group_size, version):
            window.admit(next_group, version, group_size)
            running[next_group] = (tick + int(rng.paretovariate(1.2)), version)  # long-tailed episode lengths
            next_group += 1
        for key, (done_at, admitted) in list(running.items()):
            if done_at <= tick:
                del running[key]
                pushed = group_size - (1 if rng.random() < 0.1 else 0)  # a failed rollout pushes no row
                queue += [admitted] * pushed
                window.finish(key, pushed)
        if queue:
            staleness.append(version - queue.pop(0))
            taken += 1
            if taken % rows_per_version == 0:
                version += 1
        if next_group == groups and not running and not queue:
            break
    return staleness, next_group, forced


@pytest.mark.parametrize(("max_staleness", "rows_per_version", "group_size"), [(1, 4, 4), (1, 8, 3), (2, 8, 3), (4, 16, 8)])
def test_no_row_is_ever_too_stale(max_staleness, rows_per_version, group_size):
    for seed in range(3):
        staleness, admitted, forced = simulate(max_staleness, rows_per_version, group_size, seed)
        assert admitted == 300 and len(staleness) > 250 * group_size  # everything ran, nothing was thrown away
        assert max(staleness) <= max_staleness and forced == 0


def test_max_staleness_0_needs_forced_groups_when_rollouts_fail():
    """With max_staleness=0 a failed rollout leaves the trainer short of a full step, and no group fits the rest of
    it; the worker then starts one anyway (the trainer may drop its rows): progress, never a deadlock."""
    staleness, admitted, forced = simulate(0, 8, 4, seed=0)
    assert admitted == 300 and forced > 0


def test_capacity_is_held_to_the_oldest_group_in_flight():
    window = StalenessWindow(max_staleness=1, rows_per_version=4, base_version=1)
    window.admit(0, 1, 4)  # a long episode started at version 1: it must be taken by row (1 - 1 + 1 + 1) * 4 = 8
    assert window.capacity(1) == 4 and window.capacity(5) == 4  # a newer version does not free its slots
    window.admit(1, 1, 4)
    assert not window.admits(1, 3)
    window.finish(1, 3)  # one rollout failed: 3 rows pushed
    assert window.capacity(3) == 1
    window.finish(0, 4)
    assert window.capacity(3) == (3 - 1 + 2) * 4 - 7
    with pytest.raises(ValueError):
        StalenessWindow(max_staleness=-1, rows_per_version=4)
