"""What runs inside one Ray worker actor: `RolloutWorker` (an engine running the groups it is sent).

The driver (`gym_bridge.scale.ray_runner.RayRollouts`) pickles a `build_engine` callable, such as
`RemoteEngineFactory`, which each worker calls once; `JournalSpec` tells a worker where to commit
its rollouts' turns so that a group sent again continues. Nothing here imports Ray at module level.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gym_bridge.core.engine import Engine, EngineConfig, ensure_ready
from gym_bridge.core.journal import RolloutKey, RunFingerprint, RunJournal, open_journal
from gym_bridge.core.record import RolloutRecord
from gym_bridge.core.registry import resolve_tasks
from gym_bridge.core.task import Task

if TYPE_CHECKING:
    from gym_bridge.policies.factory import PolicySpec


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker reports once it is ready."""

    pid: int
    model: str
    """The model name its engine reports."""
    node: str
    """The host name of the node it runs on."""
    config: EngineConfig
    """Its engine's settings (what a journal's fingerprint holds)."""


class RolloutWorker:
    """One Ray actor: an engine built by `build_engine`, running the groups it is sent."""

    def __init__(self, build_engine: bytes, sys_path: Sequence[str]) -> None:
        for entry in reversed(sys_path):  # the driver's import path, so its environments and factories import here
            if entry not in sys.path and os.path.isdir(entry):
                sys.path.insert(0, entry)
        from ray import cloudpickle

        self.engine: Engine = cloudpickle.loads(build_engine)()
        self.journaled: Engine | None = None
        """`engine` committing to the run's journal (a journal file of this worker's own), once a group brings one."""

    def ready(self, samples: Sequence[Task]) -> WorkerInfo:
        """Check that the environments of `samples` (one task of each) resolve and can run here
        (`check_ready`); returns the worker's pid, node, model name and engine settings."""
        ensure_ready(resolve_tasks(samples, self.engine.trust).values())
        return WorkerInfo(pid=os.getpid(), model=self.engine.config.model_name, node=socket.gethostname(), config=self.engine.config)

    def journal_visible(self, directory: str) -> str | None:
        """None when the driver's journal `directory` is there on this node, else why not (a node without the shared
        file system)."""
        if os.path.isdir(directory):
            return None
        return f"node {socket.gethostname()} does not see the journal directory {directory}"

    async def run_group(self, task: Task, repeats: Sequence[int], journal: JournalSpec | None = None) -> list[RolloutRecord]:
        """The records of `repeats` of `task`; with `journal`, each rollout commits its turns to this worker's own file of
        it, and one sent again (`journal.resume`) continues from the turns any process committed."""
        env_class = resolve_tasks([task], self.engine.trust)[task.env_name]
        keys = [RolloutKey.of_task(task.index, repeat) for repeat in repeats]
        engine = self.engine
        if journal is not None:
            engine, run_journal = self._join(journal)
            if journal.resume:
                run_journal.load(keys)
        return list(await asyncio.gather(*(engine.rollout(task, repeat, env_class=env_class, key=key)
                                           for repeat, key in zip(repeats, keys))))

    def _join(self, spec: JournalSpec) -> tuple[Engine, RunJournal]:
        """The engine committing to the journal `spec` names, and that journal (joined once per directory)."""
        journaled = self.journaled
        if journaled is None or journaled.journal is None or str(journaled.journal.directory) != spec.directory:
            journaled = self.journaled = self.engine.with_journal(open_journal(spec.directory, spec.fingerprint, mode="join"))
        assert journaled.journal is not None
        return journaled, journaled.journal

    def replica_stats(self) -> dict[str, Any]:
        router = getattr(self.engine.policy, "router", None)
        return router.stats() if router is not None else {}

    def pid(self) -> int:
        return os.getpid()

    async def close(self) -> None:
        """Close the policy's connections (before the actor is killed)."""
        aclose = getattr(self.engine.policy, "aclose", None)
        if aclose is not None:
            await aclose()


@dataclass(frozen=True)
class JournalSpec:
    """What a worker needs to commit to the run's journal: its directory (on the driver's file system, which every
    worker must see at the same path) and the run's fingerprint; `resume` when the group's rollouts may have turns
    committed by an earlier process."""

    directory: str
    fingerprint: RunFingerprint
    resume: bool = False


@dataclass(frozen=True)
class RemoteEngineFactory:
    """Builds, inside a worker, an engine that generates on OpenAI-compatible servers (a trainer's vLLM
    servers): the trainer's template and engine settings, and a fresh policy built from the same
    `PolicySpec` as the trainer's own (its servers, request timeout and retries)."""

    spec: PolicySpec
    template: Any
    config: Any

    def __call__(self) -> Engine:
        from dataclasses import replace

        from gym_bridge.core.policy import require_token_policy
        from gym_bridge.policies.factory import build_policy

        policy = require_token_policy(build_policy(self.spec))
        return Engine(policy, self.template, replace(self.config, template_check="off"))  # checked in the trainer's process
