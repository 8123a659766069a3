"""Train and validation splits of generated tasks that can never overlap.

Generators draw tasks from a seeded random generator; `draw_split` keeps the distinct ones that
fall into the requested split, chosen by a hash of each task's key (one in ten goes to
`validation`). The split follows from the task itself, so no seed of `train` can produce a
`validation` task.
"""

from __future__ import annotations

import hashlib
import random
from typing import Callable, TypeVar

SPLITS = ("train", "validation")
VALIDATION_SHARE = 10
"""One task in this many belongs to `validation`."""

T = TypeVar("T")


def split_of(key: str) -> str:
    """`validation` or `train` for a task whose identity is `key`."""
    return "validation" if int(hashlib.sha256(key.encode()).hexdigest(), 16) % VALIDATION_SHARE == 0 else "train"


def draw_split(make: Callable[[random.Random], T], key: Callable[[T], str], *, split: str, size: int, seed: int) -> list[T]:
    """`size` distinct tasks of `split` made by `make(rng)` from `random.Random(seed)`, in draw order.

    Raises ValueError for an unknown split, or when `size` distinct tasks of the split do not
    turn up within `1000 * size` draws.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be 'train' or 'validation', got {split!r}")
    rng = random.Random(seed)
    drawn: list[T] = []
    seen: set[str] = set()
    for _ in range(1000 * size):
        if len(drawn) == size:
            break
        task = make(rng)
        identity = key(task)
        if identity not in seen and split_of(identity) == split:
            seen.add(identity)
            drawn.append(task)
    if len(drawn) < size:
        raise ValueError(f"could only generate {len(drawn)} distinct {split} tasks, not {size}")
    return drawn
