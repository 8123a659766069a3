"""gb_faults: a verifiers v1 taskset and `Env` that fail on purpose, for gym_bridge's tests of its failure paths.

Each task names its `fault`: `raise` (the env's `run()` raises after the agent's turn), `hang` (it never returns),
or `none` (it plays as `gb_arithmetic` does: one turn, `correct` is 1.0 for the answer 42). Written against
`verifiers.v1`'s public API, loaded by verifiers' own loader like any other v1 environment.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any, Literal

import verifiers.v1 as vf

FAULTS = ("none", "raise", "hang")


class FaultData(vf.TaskData):
    fault: Literal["none", "raise", "hang"]
    """What the env does after the agent's turn."""


class FaultTask(vf.Task[FaultData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, trace: vf.Trace) -> float:
        numbers = re.findall(r"-?\d+", trace.last_reply)
        return float(bool(numbers) and numbers[-1] == "42")


class FaultEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()


class FaultEnv(vf.Env[FaultEnvConfig]):
    async def run(self, task: Any, agents: Any) -> None:
        await agents.agent.run(task)
        if task.data.fault == "raise":
            raise RuntimeError("gb_faults: the env raised on purpose")
        if task.data.fault == "hang":
            await asyncio.Event().wait()


class FaultTaskset(vf.Taskset[FaultTask, vf.TasksetConfig]):
    def load(self) -> Iterator[FaultTask]:
        for fault in FAULTS:
            yield FaultTask(FaultData(name=f"fault#{fault}", prompt="What is 12 + 30?", fault=fault), self.config.task)


__all__ = ["FaultEnv", "FaultTaskset"]
