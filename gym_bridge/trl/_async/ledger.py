"""Which groups of the async worker the trainer has taken, as a trainer checkpoint records it, so a restart goes on from it.

The worker numbers its groups (group `g` runs task `g % len(tasks)`) and pushes each group's rows at once; the trainer
takes them one by one. `GroupLedger` counts both and gives `WorkerState`: the first group whose rows the trainer has
not all taken, the groups after it that it has, and the policy version. Saved with a checkpoint and given back to the
worker of the restarted trainer, it says which groups to skip and where to go on, and which journaled groups are done.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gym_bridge.core.errors import ConfigError

STATE_VERSION = 1


@dataclass(frozen=True)
class WorkerState:
    """The worker's progress as a trainer checkpoint holds it."""

    next_group: int
    """The first group whose rows the trainer had not all taken: a restarted worker goes on from here."""
    taken_after: tuple[int, ...]
    """Groups after `next_group` whose rows the trainer had all taken (groups finish out of order): skipped."""
    model_version: int
    """The trainer's policy version (its weight syncs so far), which a restarted trainer goes on counting from."""

    def covers(self, group_id: int) -> bool:
        """Whether the trainer had taken every row of `group_id` when this state was saved."""
        return group_id < self.next_group or group_id in self.taken_after

    def to_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "next_group": self.next_group, "taken_after": list(self.taken_after),
                "model_version": self.model_version}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "the worker state") -> WorkerState:
        """Raises ConfigError naming `source` for a state of another version or with a missing or bad field."""
        if data.get("version") != STATE_VERSION:
            raise ConfigError(f"{source}: worker state version {data.get('version')!r}, this gym_bridge reads version {STATE_VERSION}")
        try:
            return cls(next_group=int(data["next_group"]), taken_after=tuple(sorted(int(g) for g in data["taken_after"])),
                       model_version=int(data["model_version"]))
        except (KeyError, TypeError, ValueError) as error:
            raise ConfigError(f"{source}: a worker state needs integer next_group and model_version and a list "
                              f"taken_after ({type(error).__name__}: {error})") from error


class GroupLedger:
    """Rows pushed per group and the groups of the rows taken, in order (the worker's loop pushes, the trainer's thread
    takes), thread-safe. A trainer's data loader takes rows ahead of the step it trains, so a checkpoint counts only
    the rows its steps trained (`trained_rows`) as covered when it knows them."""

    def __init__(self, start: WorkerState | None = None) -> None:
        self.start = start
        self._lock = threading.Lock()
        self._pushed: dict[int, int] = {}
        self._takes: list[int] = []
        """The group of each row taken since `start`, in order."""
        self._held: set[int] = set()
        """Groups pushed whose journal is kept until a checkpoint covers them."""

    def pushed(self, group_id: int, rows: int) -> None:
        """`rows` rows of `group_id` are about to enter the buffer (called before they do)."""
        with self._lock:
            self._pushed[group_id] = rows
            self._held.add(group_id)

    def taken(self, group_id: int) -> None:
        """The trainer took one row of `group_id`."""
        with self._lock:
            self._takes.append(group_id)

    def state(self, model_version: int, *, trained_rows: int | None = None) -> WorkerState:
        """The progress to save with a checkpoint now: the groups every row of which is among the first `trained_rows`
        rows taken since `start` (None: every row taken so far)."""
        with self._lock:
            taken = Counter(self._takes if trained_rows is None else self._takes[:max(trained_rows, 0)])
            covered = {group for group, rows in self._pushed.items() if taken[group] >= rows}
            if self.start is not None:
                covered |= set(self.start.taken_after)
            first = self.start.next_group if self.start is not None else 0
            while first in covered:
                first += 1
            return WorkerState(next_group=first, taken_after=tuple(sorted(g for g in covered if g > first)), model_version=model_version)

    def release(self, state: WorkerState) -> list[int]:
        """The groups `state` covers whose journal was kept: a saved checkpoint no longer needs them."""
        with self._lock:
            released = sorted(g for g in self._held if state.covers(g))
            self._held.difference_update(released)
            return released

    def order(self, resumed: Sequence[int]) -> Iterator[int]:
        """The group ids to run: `resumed` (left in flight in the journal) first, then on from where the trainer's
        checkpoint says, skipping the groups it had taken; with no checkpoint, on from the last resumed group."""
        start = self.start
        if start is None:
            return itertools.chain(resumed, itertools.count(max(resumed) + 1 if resumed else 0))
        again = set(resumed)
        rest = (g for g in itertools.count(start.next_group) if g not in again and not start.covers(g))
        return itertools.chain(resumed, rest)
