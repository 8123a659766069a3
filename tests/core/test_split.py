"""Generated tasks split by a hash of themselves: deterministic, and train never meets validation."""

import pytest

from gym_bridge.core.split import draw_split, split_of


def make(rng):
    return rng.randrange(10_000)


def test_same_seed_same_tasks_and_splits_never_overlap():
    train = draw_split(make, str, split="train", size=200, seed=1)
    assert train == draw_split(make, str, split="train", size=200, seed=1)
    assert len(set(train)) == 200                                  # distinct
    validation = draw_split(make, str, split="validation", size=50, seed=2)
    assert not set(train) & set(validation)                       # different seeds, still disjoint
    assert {split_of(str(task)) for task in validation} == {"validation"}
    share = sum(split_of(str(n)) == "validation" for n in range(10_000)) / 10_000
    assert 0.08 < share < 0.12                                     # about one in ten


def test_bad_split_or_too_few_distinct_tasks_is_an_error():
    with pytest.raises(ValueError, match="split must be"):
        draw_split(make, str, split="test", size=1, seed=0)
    with pytest.raises(ValueError, match="could only generate"):
        draw_split(lambda rng: rng.randrange(3), str, split="train", size=5, seed=0)
