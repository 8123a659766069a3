"""Which weights version a training row carries, and when the async worker may start a group.

A long episode keeps generating across weight syncs (the server pauses with "keep" and goes on under the new
weights), so its tokens come from several versions. TRL drops a row whose `model_version` is more than
`max_staleness` versions behind the trainer when it takes it; which version a row carries is `RowVersion`:
- `"last_call"` (default): the version the worker knew when the rollout's last model call returned; its final
  call's tokens are from that version or older, its earlier calls' maybe older still (partial rollouts).
- `"first_call"`: the version its first model call started under, i.e. its oldest token's.
`CallClock` follows each rollout's calls: under `"last_call"` a group's floor, the lowest version its rows can still
carry, rises with its calls, and `StalenessWindow` bounds the groups by their floors, so no admitted row is dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Literal

from gym_bridge.core.policy import Generation, GenerationRequest, Policy

__all__ = ["ROLLOUT", "CallClock", "ClockedPolicy", "RowVersion"]

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
