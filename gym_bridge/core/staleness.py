"""Bounded staleness by admission: start only the work the trainer will still accept when it arrives.

An async trainer consumes rows in the order they are pushed and moves its policy version on by one
every `rows_per_version` rows (at least). A row stamped with version v (its oldest token's, or the later
one a partial rollout's last call earns, see `advance`) and that is the trainer's N-th row is consumed at version at most `base + (N - 1) // rows_per_version`,
so it is at most `max_staleness` stale when `N <= (v - base + max_staleness + 1) * rows_per_version`.
`StalenessWindow` admits a group only while every group in flight keeps that bound (the rows pushed
plus the rows reserved by groups in flight stay under the limit of the lowest-versioned group), so finished
groups are never thrown away for staleness; the price is generation waiting, not discarded work.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StalenessWindow:
    """Which groups may start now; not thread-safe (one event loop owns it)."""

    max_staleness: int
    """Versions a row may lag the trainer when consumed (TRL's `max_staleness`)."""
    rows_per_version: int
    """Rows the trainer consumes at least between two version bumps (samples per step times steps per sync)."""
    base_version: int = 0
    """The trainer's version when the count of pushed rows was 0."""
    pushed: int = 0
    """Rows pushed to the trainer so far."""
    _in_flight: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Group key -> (the lowest version its rows can carry: at admission, or as `advance` raised it; rows reserved)."""

    def __post_init__(self) -> None:
        if self.max_staleness < 0 or self.rows_per_version < 1:
            raise ValueError(f"max_staleness must be >= 0 and rows_per_version >= 1, got {self.max_staleness} and {self.rows_per_version}")

    @property
    def in_flight_rows(self) -> int:
        return sum(rows for _, rows in self._in_flight.values())

    @property
    def in_flight_groups(self) -> int:
        return len(self._in_flight)

    def oldest_version(self, version: int) -> int:
        """The oldest admission version among groups in flight and `version` (the one about to start)."""
        return min([admitted for admitted, _ in self._in_flight.values()] + [version])

    def capacity(self, version: int) -> int:
        """Rows that may still be admitted at trainer version `version` without any row breaking the bound."""
        limit = (self.oldest_version(version) - self.base_version + self.max_staleness + 1) * self.rows_per_version
        return limit - self.pushed - self.in_flight_rows

    def admits(self, rows: int, version: int) -> bool:
        return self.capacity(version) >= rows

    def admit(self, key: int, version: int, rows: int) -> None:
        """Reserve `rows` for group `key`, started at `version` (call after `admits`, or to force progress)."""
        if key in self._in_flight:
            raise ValueError(f"group {key} is already in flight")
        self._in_flight[key] = (version, rows)

    def advance(self, key: int, version: int) -> None:
        """Group `key`'s rows will carry `version` or newer (a partial rollout's later calls): its bound rises with it.
        Only a version every row of the group will carry keeps the bound; a lower one leaves the group as it was."""
        admitted, rows = self._in_flight[key]
        if version > admitted:
            self._in_flight[key] = (version, rows)

    def finish(self, key: int, rows_pushed: int) -> None:
        """Group `key` is done and pushed `rows_pushed` rows (fewer than reserved when rollouts failed)."""
        del self._in_flight[key]
        self.pushed += rows_pushed

    def worst_staleness(self, version_at_admission: int, position: int) -> int:
        """The most stale a row at push `position` (1-based) of a group admitted at `version_at_admission` can be."""
        return self.base_version + (position - 1) // self.rows_per_version - version_at_admission
