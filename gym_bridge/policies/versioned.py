"""A policy wrapper that stamps each generation with the policy version it was sampled under.

An async trainer moves the served weights on while rollouts run; the rollout worker knows the live
version (`update_model_version`). The version read when a call starts is the version of the call's
oldest token: a weight sync during the call (vLLM's pause "keep" then resume) only makes its later
tokens newer. A version bumped on the server before the worker hears of it is stamped older than it
is, which errs towards staleness, never away from it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from gym_bridge.core.policy import Generation, GenerationRequest, Policy


class VersionedPolicy:
    """`policy` whose generations carry `policy_version=version()` read when each call starts."""

    parks_calls = True
    """The async trainer pauses generation around a weight sync: a call's time is not the rollout deadline's
    (`gym_bridge.core.bounded.deadline`); each call is bounded by `EngineConfig.generation_timeout_s` instead."""

    def __init__(self, policy: Policy, version: Callable[[], int]) -> None:
        self.policy = policy
        self.version = version

    async def generate(self, request: GenerationRequest) -> Generation:
        version = self.version()
        generation = await self.policy.generate(request)
        return dataclasses.replace(generation, policy_version=version)

    async def aclose(self) -> None:
        await self.policy.aclose()
