"""Which weights version a training row carries, and when the async worker may start a group.

A long episode keeps generating across weight syncs (the server pauses with "keep" and goes on under the new
weights), so its tokens come from several versions. TRL drops a row whose `model_version` is more than
`max_staleness` versions behind the trainer when it takes it; which version a row carries is `RowVersion`:
- `"last_call"` (default): the version the worker knew when the rollout's last model call returned; its final
  call's tokens are from that version or older, its earlier calls' maybe older still (partial rollouts).
- `"first_call"`: the version its first model call started under, i.e. its oldest token's.
`CallClock` follows each rollout's calls: under `"last_call"` a group's floor, the lowest version its rows can still
carry, rises with its calls, and `StalenessWindow` bounds the groups by their floors, so no admitted row is dropped.
`Admission` holds the window, the clock and the groups in flight for the worker's loop, which alone touches it; with a
row budget (the rows the trainer will still take) it starts no group once the rows pushed and reserved cover it, so
every episode started is trained and none is generated for nothing at the end of the run.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Literal

from gym_bridge.core.policy import Generation, GenerationRequest, Policy
from gym_bridge.core.record import RolloutRecord
from gym_bridge.core.staleness import StalenessWindow

__all__ = ["ROLLOUT", "Admission", "CallClock", "ClockedPolicy", "RowVersion"]

WAKE_CHECK_S = 0.5
"""How often a group waiting for the window looks again without being woken (a stop, a missed wake-up)."""

RowVersion = Literal["last_call", "first_call"]

ROLLOUT: ContextVar[tuple[int, int] | None] = ContextVar("gym_bridge_async_rollout", default=None)
"""The (group, repeat) whose rollout runs in this task; set by the worker around each `Engine.rollout`."""


@dataclass
class _Calls:
    running: int = 0
    """Model calls of the rollout in flight now."""
    returned_at: int | None = None
    """The version the worker knew when its latest call returned (None: no call returned yet)."""


@dataclass
class CallClock:
    """Each rollout's model calls, for the row versions and the window's floors; one event loop owns it."""

    version: Callable[[], int]
    on_change: Callable[[], None] = lambda: None
    """Called when a rollout's floor rises outside a version bump (its next call starts under a newer version)."""
    _rollouts: dict[tuple[int, int], _Calls] = field(default_factory=dict)

    def begin(self, key: tuple[int, int]) -> None:
        calls = self._rollouts.setdefault(key, _Calls())
        calls.running += 1
        if calls.returned_at is not None and calls.returned_at < self.version():
            self.on_change()

    def end(self, key: tuple[int, int]) -> None:
        calls = self._rollouts[key]
        calls.running -= 1
        calls.returned_at = self.version()

    def floor(self, key: tuple[int, int]) -> int:
        """The lowest version rollout `key`'s rows can still carry under `"last_call"`; it never falls."""
        calls = self._rollouts.get(key)
        if calls is None or calls.running or calls.returned_at is None:
            return self.version()  # a call in flight or still to come returns under this version or a newer one
        return calls.returned_at

    def returned_at(self, key: tuple[int, int]) -> int | None:
        """The version the worker knew when rollout `key`'s latest call returned (None: it made no live call)."""
        calls = self._rollouts.get(key)
        return None if calls is None else calls.returned_at

    def forget(self, group_id: int, group_size: int) -> None:
        for repeat in range(group_size):
            self._rollouts.pop((group_id, repeat), None)


class ClockedPolicy:
    """`policy` whose calls are counted on `clock` under the rollout the calling task runs (`ROLLOUT`)."""

    parks_calls = True
    """As the versioned policy it wraps: the trainer parks calls around a weight sync (`core.bounded.deadline`)."""

    def __init__(self, policy: Policy, clock: CallClock) -> None:
        self.policy = policy
        self.clock = clock

    async def generate(self, request: GenerationRequest) -> Generation:
        key = ROLLOUT.get()
        if key is None:
            return await self.policy.generate(request)
        self.clock.begin(key)
        try:
            return await self.policy.generate(request)
        finally:
            self.clock.end(key)

    async def aclose(self) -> None:
        await self.policy.aclose()


class Admission:
    """When the worker's next group may start, and the version each of its rows carries; owned by the worker's loop.

    A group starts when `StalenessWindow` admits its rows at the trainer's version, or, with nothing in flight and
    nothing waiting for the trainer, anyway (`forced_admissions`: the trainer can only wait for rows, so never a deadlock)."""

    def __init__(self, window: StalenessWindow, *, group_size: int, row_version: RowVersion, version: Callable[[], int],
                 counts: Counter[str], row_budget: int | None = None) -> None:
        self.window = window
        self.row_budget = row_budget
        """Rows the trainer will take from this worker in all (None: no end): see `within_budget`."""
        self.group_size = group_size
        self.row_version_rule: RowVersion = row_version
        self.version = version
        self.clock = CallClock(version, on_change=self.wake)
        self.admitted: set[int] = set()
        """Groups in the window now."""
        self.counts = counts
        """`forced_admissions`: groups started with nothing in flight although the window was full."""
        self._wake: asyncio.Event | None = None

    def wake(self) -> None:
        """Look at the window again (a version bump, a group done, a floor risen); on the loop's thread only."""
        if self._wake is not None:
            self._wake.set()

    async def wait(self, group_id: int, *, idle: Callable[[], bool], stopping: Callable[[], bool]) -> float | None:
        """Wait until group `group_id` may start, then reserve its rows; the seconds waited, None when stopping.
        `idle()`: nothing in flight and no row waiting for the trainer."""
        if self._wake is None:
            self._wake = asyncio.Event()
        started = time.perf_counter()
        while not stopping():
            self._advance_floors()
            if self.within_budget():
                if self.window.admits(self.group_size, self.version()):
                    break
                if idle():
                    self.counts["forced_admissions"] += 1
                    break
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=WAKE_CHECK_S)
            except TimeoutError:
                pass
        else:
            return None
        self.window.admit(group_id, self.version(), self.group_size)
        self.admitted.add(group_id)
        return time.perf_counter() - started

    def within_budget(self) -> bool:
        """Whether the trainer still needs rows beyond those pushed and those reserved by the groups in flight; a group
        that pushes fewer rows than it reserved (a failed rollout) reopens the budget when it finishes."""
        return self.row_budget is None or self.window.pushed + self.window.in_flight_rows < self.row_budget

    def finish(self, group_id: int, rows_pushed: int) -> None:
        """Group `group_id` is done and pushed `rows_pushed` rows: its reservation goes, the next group may start."""
        self.window.finish(group_id, rows_pushed)
        self.admitted.discard(group_id)
        self.clock.forget(group_id, self.group_size)
        self.wake()

    def row_version(self, group_id: int, repeat: int, record: RolloutRecord) -> int:
        """The version rollout `repeat` of `group_id`'s rows carry (see `RowVersion`)."""
        if self.row_version_rule == "first_call":
            return min(record.policy_versions) if record.policy_versions else self.version()
        returned = self.clock.returned_at((group_id, repeat))
        if returned is not None:
            return returned
        return max(record.policy_versions) if record.policy_versions else self.version()  # every call replayed from the journal

    def _advance_floors(self) -> None:
        """Under `"last_call"`, raise each group's bound in the window to the lowest version its rows can still carry."""
        if self.row_version_rule != "last_call":
            return
        for group_id in self.admitted:
            floor = min(self.clock.floor((group_id, repeat)) for repeat in range(self.group_size))
            self.window.advance(group_id, floor)
