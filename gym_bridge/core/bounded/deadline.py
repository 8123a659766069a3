"""A rollout's deadline, held while a model call may be parked by the trainer.

Async trainers (verl's `colocate_async`, `separate_async`, fully async and one-step-off modes, TRL's async
GRPO) pause generation for a train step and a weight update; a model call in flight then waits inside
the policy for as long as that takes. A policy whose calls may be parked says so (`parks_calls = True`):
while such a call is in flight the rollout's deadline stands still, and the call is bounded by its own
`generation_timeout_s` instead. Setup, tools, verify and the work between calls stay under the deadline;
the calls of every other policy count against it as before. `HeldPolicy` does the same for calls a rollout
makes outside its agent loop's `generate` (a harness's capture session).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext

from gym_bridge.core.errors import FailRollout
from gym_bridge.core.policy import Generation, GenerationRequest, Policy

__all__ = ["HeldPolicy", "RolloutDeadline", "parks_calls"]


_NOT_HELD: AbstractAsyncContextManager[object] = nullcontext()
"""The model call of a policy whose calls are never parked: nothing to hold (one object, reentrant)."""


def parks_calls(policy: object) -> bool:
    """Whether `policy` declares (`parks_calls = True`) that a trainer may park its calls mid-generation."""
    return getattr(policy, "parks_calls", False) is True


class RolloutDeadline:
    """The wall-time bound of one rollout (`deadline_s`), less the time its parkable model calls were in flight.

    `running()` holds the deadline over the rollout; `model_call()` wraps each model call. With `parked`
    false (the policy's calls are never parked) `model_call` changes nothing: the call counts against the
    deadline. With `parked` true the deadline stops while one or more calls are in flight (concurrent calls
    of a harness count once) and resumes with the time it had left; each call is bounded by `generation_timeout_s`.
    """

    def __init__(self, *, deadline_s: float, generation_timeout_s: float, parked: bool) -> None:
        self.deadline_s = deadline_s
        self.generation_timeout_s = generation_timeout_s
        self.parked = parked
        self.excluded_s = 0.0
        """Seconds the deadline stood still for parkable model calls (so far)."""
        self._timeout: asyncio.Timeout | None = None
        self._in_flight = 0
        self._held_at = 0.0
        self._left_s = 0.0

    def running(self) -> AbstractAsyncContextManager[object]:
        """The rollout's body: raises TimeoutError when the deadline passes (as `asyncio.timeout` does)."""
        if not self.parked:
            return asyncio.timeout(self.deadline_s)  # no call is ever held: the timeout runs as it is
        return self._running_held()

    @asynccontextmanager
    async def _running_held(self) -> AsyncIterator[None]:
        async with asyncio.timeout(self.deadline_s) as timeout:
            self._timeout = timeout
            try:
                yield
            finally:
                self._timeout = None

    def model_call(self) -> AbstractAsyncContextManager[object]:
        """One model call. Raises FailRollout(`timeout`) when a parkable call runs past `generation_timeout_s`."""
        return self._held_call() if self.parked else _NOT_HELD

    @asynccontextmanager
    async def _held_call(self) -> AsyncIterator[None]:
        self._hold()
        try:
            async with asyncio.timeout(self.generation_timeout_s) as bound:
                try:
                    yield
                finally:
                    self._release()
        except TimeoutError:
            if bound.expired():
                raise FailRollout("timeout", f"a model call did not return within generation_timeout_s={self.generation_timeout_s:g} s "
                                                "(time parked by the trainer included)") from None
            raise

    def _hold(self) -> None:
        self._in_flight += 1
        timeout = self._timeout
        if self._in_flight > 1 or timeout is None or timeout.expired():
            return
        loop = asyncio.get_running_loop()
        when = timeout.when()
        self._held_at = loop.time()
        self._left_s = (when - self._held_at) if when is not None else float("inf")
        timeout.reschedule(None)

    def _release(self) -> None:
        self._in_flight -= 1
        timeout = self._timeout
        if self._in_flight > 0 or timeout is None or timeout.expired():
            return
        now = asyncio.get_running_loop().time()
        self.excluded_s += now - self._held_at
        timeout.reschedule(now + self._left_s)  # at or before now: it fires at once


class HeldPolicy:
    """`policy` whose every call goes through `deadline.model_call()`: for model calls a rollout makes outside
    `RolloutContext.generate` (a harness's capture session serving its agent)."""

    def __init__(self, policy: Policy, deadline: RolloutDeadline) -> None:
        self.policy = policy
        self.deadline = deadline

    async def generate(self, request: GenerationRequest) -> Generation:
        async with self.deadline.model_call():
            return await self.policy.generate(request)

    async def aclose(self) -> None:
        await self.policy.aclose()
