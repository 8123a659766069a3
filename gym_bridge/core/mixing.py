"""Seeded weighted mixing of several lists of rows into one shuffled list.

Each source contributes a number of rows proportional to its weight (largest remainder, so
the counts sum exactly to the total); a source is drawn in whole shuffled passes, so a small
source repeats evenly instead of at random. Used by `gym-bridge data mix` and the TRL dataset.
"""

from __future__ import annotations

import random
from typing import Sequence, TypeVar

T = TypeVar("T")


def mix_counts(sizes: Sequence[int], weights: Sequence[float], total: int) -> list[int]:
    """Rows to draw from each source: proportional to `weights`, summing to `total` (largest
    remainder); an empty source gets 0."""
    scale = total / sum(weights)
    exact = [weight * scale for weight in weights]
    counts = [int(value) for value in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: exact[i] - counts[i], reverse=True)
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return [count if size else 0 for count, size in zip(counts, sizes)]


def draw_positions(count: int, size: int, rng: random.Random) -> list[int]:
    """`count` positions out of `size`: whole shuffled passes, then part of one more."""
    drawn: list[int] = []
    while len(drawn) < count:
        order = list(range(size))
        rng.shuffle(order)
        drawn.extend(order[: count - len(drawn)])
    return drawn


def check_weights(weights: Sequence[float], num_sources: int) -> None:
    """Raise ValueError unless there is one non-negative weight per source, not all zero."""
    if len(weights) != num_sources:
        raise ValueError(f"got {len(weights)} weights for {num_sources} sources")
    if any(weight < 0 for weight in weights) or sum(weights) <= 0:
        raise ValueError(f"weights must be non-negative and not all zero, got {list(weights)}")


def weighted_mix(sources: Sequence[Sequence[T]], weights: Sequence[float], total: int, rng: random.Random) -> list[T]:
    """`total` entries drawn from `sources` in proportion to `weights`, shuffled with `rng`."""
    check_weights(weights, len(sources))
    counts = mix_counts([len(source) for source in sources], weights, total)
    chosen = [source[i] for source, count in zip(sources, counts) for i in draw_positions(count, len(source), rng)]
    rng.shuffle(chosen)
    return chosen
