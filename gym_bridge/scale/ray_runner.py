"""Rollouts on Ray: gym_bridge's own engine and environments, run inside Ray actors on a cluster.

`RayRollouts` starts (or joins) a Ray cluster, starts worker actors that each build an `Engine`
with a picklable `build_engine` callable, and sends them groups (the repeats of one task, which
stay together on one worker). It has the engine's own `stream` and `run_groups`, so `run_eval`
writes, resumes and summarizes a Ray run exactly as a local one. Workers are placed by Ray with the
resources each environment asks for (`ray_resources` on the class or `--env-setting
NAME.ray_resources=...`: `num_cpus`, `num_gpus`, `memory` in bytes, and custom ones such as
`sandbox`); environments with different requests get their own workers. Each worker's engine bound
and its actor `max_concurrency` are set explicitly (never Ray's default of 1000 async calls) and
stated at start. A worker that dies loses only its groups in flight: Ray restarts it, and those
groups run again up to `max_retries` times, then end as `infra` failure records. Reaching the
cluster is `ray_cluster`'s, the worker actor `ray_worker`'s; their names import from there.
"""

from __future__ import annotations

import asyncio
import copy
import math
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gym_bridge.core.engine import Engine
from gym_bridge.core.environment import Environment
from gym_bridge.core.errors import ConfigError, SetupError
from gym_bridge.core.journal import RolloutKey, RunFingerprint, RunJournal
from gym_bridge.core.record import RolloutRecord
from gym_bridge.core.registry import TaskSet, resolve_tasks
from gym_bridge.core.trust import DEFAULT_TRUST, TrustSettings
from gym_bridge.core.task import Task
from gym_bridge.core.trajectory import Trajectory
from gym_bridge.policies.router import merge_stats
from gym_bridge.scale import admission
from gym_bridge.scale.ray_cluster import (
    RayOptions,
    connect,
)
from gym_bridge.scale.ray_worker import JournalSpec, RolloutWorker

RESOURCE_KEYS = ("num_cpus", "num_gpus", "memory")
"""Keys of `ray_resources` that are Ray's own actor options; every other key is a custom resource."""


@dataclass
class _Worker:
    handle: Any
    in_flight: int = 0
    """Rollouts sent and not yet back."""
    recovering: asyncio.Task[bool] | None = None
    """Set while a worker that died is being restarted by Ray; no group is sent to it meanwhile."""
    lost: bool = False
    """Ray gave up restarting it."""


@dataclass
class _Group:
    task: Task
    repeats: list[int]
    attempts: int = 0
    errors: list[str] = field(default_factory=list)


def resources_of(env_class: type[Environment], *, default_num_cpus: float) -> dict[str, Any]:
    """The actor options for workers of `env_class`: its `ray_resources` split into Ray's own
    (`num_cpus`, `num_gpus`, `memory`) and custom `resources`. Raises GymBridgeError for a bad entry."""
    requested = dict(getattr(env_class, "ray_resources", None) or {})
    options: dict[str, Any] = {"num_cpus": default_num_cpus}
    custom: dict[str, float] = {}
    for key, value in requested.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"environment {env_class.name!r}: ray_resources[{key!r}] must be a non-negative number, got {value!r}")
        if key in RESOURCE_KEYS:
            options[key] = value
        else:
            custom[key] = float(value)
    if custom:
        options["resources"] = custom
    return options


def _shape_key(options: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((key, tuple(sorted(value.items())) if isinstance(value, dict) else value) for key, value in options.items()))


def placeable(options: Mapping[str, Any], cluster: Mapping[str, float]) -> int:
    """How many workers with these actor options the cluster's total resources can hold at once."""
    needs = {"CPU": options.get("num_cpus", 0), "GPU": options.get("num_gpus", 0), "memory": options.get("memory", 0),
             **options.get("resources", {})}
    counts = [math.floor(cluster.get(name, 0.0) / amount + 1e-9) for name, amount in needs.items() if amount]
    return min(counts) if counts else 1_000_000


class RayRollouts:
    """Runs rollouts on Ray workers; `stream` and `run_groups` behave as the engine's own.

    `build_engine` is called once in each worker (it must be picklable by cloudpickle: a function of
    an importable module, or a frozen dataclass with `__call__`). `max_concurrency` is the rollouts in
    flight over all workers, as the engine's bound is for a local run.
    """

    def __init__(self, build_engine: Callable[[], Engine], options: RayOptions | None = None, *, max_concurrency: int = 64,
                 report: Callable[[str], None] | None = None, engine_limits: Mapping[str, int | None] | None = None,
                 trust: TrustSettings = DEFAULT_TRUST) -> None:
        self.build_engine = build_engine
        self.trust = trust
        """What rows may route to (`gym_bridge.core.trust`), for tasks given as a list (a `TaskSet` was routed by its run);
        the workers' engines hold their own (`build_engine`)."""
        self.options = options or RayOptions()
        if self.options.num_workers < 1 or self.options.max_retries < 0:
            raise ConfigError("Ray options: num_workers must be at least 1 and max_retries non-negative")
        self.max_concurrency = max_concurrency
        self.engine_limits = dict(engine_limits or {})
        """Per-worker bounds for the admission statement: `engine` (the engine's max_concurrency), `per_env`,
        `replica_connections` (the policy's connection pool)."""
        self.report = report or (lambda line: print(line, file=sys.stderr, flush=True))
        self.worker_concurrency = self.options.worker_concurrency or max(1, math.ceil(max_concurrency / self.options.num_workers))
        self.model_name = ""
        self.plan: admission.AdmissionPlan | None = None
        self._ray: Any = None
        self._pools: dict[tuple[tuple[str, Any], ...], list[_Worker]] = {}
        self._pool_of_env: dict[str, tuple[tuple[str, Any], ...]] = {}
        self._worker_class: Any = None
        self.engine_config: Any = None
        """The workers' `EngineConfig`, as the first one reported it (what a journal's fingerprint holds)."""
        self.journal: RunJournal | None = None
        """The run's journal (`with_journal`): workers commit to it, and a group sent again continues from it."""

    def _routed(self, tasks: Iterable[Task] | TaskSet) -> TaskSet:
        """`tasks` with their environment classes: a `TaskSet` as its run routed it, a list routed here with `trust`."""
        if isinstance(tasks, TaskSet):
            return tasks
        listed = tuple(tasks)
        return TaskSet(listed, resolve_tasks(listed, self.trust))

    # -- start-up -----------------------------------------------------------------------------------

    def start(self, tasks: Sequence[Task] | TaskSet, *, group_size: int = 1) -> None:
        """Join the cluster and start the workers the environments need; each checks it can run them.

        Raises a UserError (nothing has run yet) when Ray is missing, the cluster cannot be reached,
        no node has the resources an environment asks for, or an environment refuses to run there.
        """
        routed = self._routed(tasks)
        env_classes, tasks = routed.env_classes, list(routed.tasks)
        samples = {task.env_name: task for task in tasks}
        self._ray = ray = connect(self.options)
        if self._worker_class is None:
            self._worker_class = ray.remote(RolloutWorker)
        cluster = ray.cluster_resources()
        shapes: dict[tuple[tuple[str, Any], ...], tuple[dict[str, Any], list[Task]]] = {}
        for name, env_class in env_classes.items():
            options = resources_of(env_class, default_num_cpus=self.options.worker_num_cpus)
            key = _shape_key(options)
            self._pool_of_env[name] = key
            shapes.setdefault(key, (options, []))[1].append(samples[name])
        least_placeable = self.options.num_workers
        for key, (options, shape_samples) in shapes.items():
            names = [task.env_name for task in shape_samples]
            if key in self._pools:
                continue
            room = placeable(options, cluster)
            if room < 1:
                raise SetupError(
                    f"no node of the Ray cluster has the resources {options} that environment(s) {', '.join(names)} ask for "
                    f"(cluster: {dict(cluster)}); add such a node or change ray_resources with --env-setting NAME.ray_resources=JSON"
                )
            least_placeable = min(least_placeable, room)
            self._pools[key] = self._start_pool(options, shape_samples, count=min(room, self.options.num_workers))
        self._state_admission(group_size=group_size, placeable_workers=least_placeable, limits=self.engine_limits,
                              environments=len(env_classes))

    def _start_pool(self, options: Mapping[str, Any], samples: Sequence[Task], *, count: int) -> list[_Worker]:
        from ray import cloudpickle

        blob: bytes = cloudpickle.dumps(self.build_engine)  # type: ignore[no-untyped-call]  # ray ships no stubs for it
        env_names = [task.env_name for task in samples]
        actor_options = {**options, "max_concurrency": self.worker_concurrency + 4, "max_restarts": self.options.max_worker_restarts,
                         "max_task_retries": 0}
        handles = [self._worker_class.options(**actor_options).remote(blob, list(sys.path)) for _ in range(count)]
        try:
            infos = self._ray.get([handle.ready.remote(list(samples)) for handle in handles])
        except Exception as error:
            for handle in handles:
                self._ray.kill(handle)
            cause = getattr(error, "cause", None) or error
            raise SetupError(f"Ray workers for {', '.join(env_names)} could not start: {cause}") from None
        self.model_name = infos[0].model
        self.engine_config = infos[0].config
        nodes = sorted({info.node for info in infos})
        self.report(f"ray: {len(handles)} workers for {', '.join(env_names)} on {len(nodes)} node(s), resources {dict(options)}, "
                    f"{self.worker_concurrency} rollouts each")
        return [_Worker(handle) for handle in handles]

    def _state_admission(self, *, group_size: int, placeable_workers: int, limits: Mapping[str, int | None], environments: int) -> None:
        self.plan = admission.plan(
            requested=self.max_concurrency, engine_concurrency=min(self.worker_concurrency, limits.get("engine") or self.worker_concurrency),
            workers=self.options.num_workers, actor_max_concurrency=self.worker_concurrency + 4, group_size=group_size,
            placeable_workers=placeable_workers, replica_connections=limits.get("replica_connections"),
            per_env_concurrency=limits.get("per_env"), environments=environments,
        )
        self.report(self.plan.describe())
        problem = admission.check(self.plan, strict=self.options.strict_admission)
        if problem is not None:
            self.report(f"warning: {problem}")

    def journal_fingerprint(self, tasks: TaskSet, *, repeats: int) -> RunFingerprint:
        """The fingerprint of a run of the workers' engine over `tasks` (starting the workers first when needed)."""
        if not self._pools or any(task.env_name not in self._pool_of_env for task in tasks.tasks):
            self.start(tasks, group_size=repeats)
        return RunFingerprint.of_engine(self.engine_config, tasks.tasks, repeats=repeats, env_classes=tasks.env_classes.values())

    def with_journal(self, journal: RunJournal | None) -> RayRollouts:
        """These workers, journaling their rollouts into `journal`'s directory (None: into none); the driver marks each
        rollout done once its record is written (`journal.shared`). Raises GymBridgeError when a worker's node does not
        see the directory: on several nodes it must be on a shared file system."""
        rollouts = copy.copy(self)
        rollouts.journal = journal
        if journal is None:
            return rollouts
        journal.shared = True
        answers = self._ray.get([worker.handle.journal_visible.remote(str(journal.directory))
                                 for pool in self._pools.values() for worker in pool if not worker.lost])
        problems = sorted({answer for answer in answers if answer})
        if problems:
            raise SetupError(f"the journal with --ray (on by default): {'; '.join(problems)}. Put --output on a file system "
                             "every node mounts at the same path, or pass --no-journal")
        return rollouts

    def _journal_spec(self, group: _Group) -> JournalSpec | None:
        journal = self.journal
        if journal is None:
            return None
        resume = group.attempts > 0 or any(journal.has_state(RolloutKey.of_task(group.task.index, repeat)) for repeat in group.repeats)
        return JournalSpec(str(journal.directory), journal.fingerprint, resume)

    # -- running ------------------------------------------------------------------------------------

    async def stream(self, tasks: Sequence[Task] | TaskSet, *, repeats: int = 1,
                     skip: Iterable[tuple[int, int]] = ()) -> AsyncIterator[RolloutRecord]:
        """Yield a record for each (task, repeat) not in `skip`, a group's records together as its group
        finishes (a `TaskSet` is not routed again)."""
        routed = self._routed(tasks)
        env_classes, tasks = routed.env_classes, list(routed.tasks)
        done = set(skip)
        groups = [_Group(task, [r for r in range(repeats) if (task.index, r) not in done]) for task in tasks]
        groups = [group for group in groups if group.repeats]
        if not self._pools or any(name not in self._pool_of_env for name in env_classes):
            self.start(tasks, group_size=max((len(group.repeats) for group in groups), default=1))
        async for records in self._run(groups, env_classes):
            for record in records:
                yield record

    async def run_groups(self, tasks: Sequence[Task], *, group_size: int) -> list[list[RolloutRecord]]:
        """All `group_size` repeats of each task, grouped and in task order."""
        by_task: dict[int, list[RolloutRecord]] = {}
        async for record in self.stream(tasks, repeats=group_size):
            by_task.setdefault(record.task.index, []).append(record)
        return [sorted(by_task[task.index], key=lambda record: record.repeat_index) for task in tasks]

    async def run_pairs(self, pairs: Sequence[tuple[Task, int]]) -> list[RolloutRecord]:
        """One record per (task, repeat index), in the order given; the repeats of one task run together
        on one worker (what a trainer adapter hands over: its batch, groups possibly split across ranks)."""
        tasks = {task.index: task for task, _ in pairs}
        if not self._pools or any(task.env_name not in self._pool_of_env for task in tasks.values()):
            self.start(list(tasks.values()), group_size=max(Counter(task.index for task, _ in pairs).values(), default=1))
        groups: dict[int, _Group] = {}
        for task, repeat in pairs:
            groups.setdefault(task.index, _Group(task, [])).repeats.append(repeat)
        by_pair: dict[tuple[int, int], RolloutRecord] = {}
        async for records in self._run(list(groups.values()), self._routed(tasks.values()).env_classes):
            by_pair.update(((record.task.index, record.repeat_index), record) for record in records)
        return [by_pair[(task.index, repeat)] for task, repeat in pairs]

    async def _run(self, groups: list[_Group], env_classes: Mapping[str, type[Environment]]) -> AsyncIterator[list[RolloutRecord]]:
        waiting = list(reversed(groups))  # popped from the end: task order
        running: dict[asyncio.Future[Any], tuple[_Group, _Worker]] = {}
        try:
            while waiting or running:
                self._dispatch(waiting, running)
                recoveries = [worker.recovering for pool in self._pools.values() for worker in pool if worker.recovering]
                if not running and not recoveries:  # every worker of some pool is lost for good
                    while waiting:
                        group = waiting.pop()
                        group.errors.append("no live worker is left for its environment")
                        yield [self._failed(group, env_classes[group.task.env_name], repeat) for repeat in group.repeats]
                    break
                finished, _ = await asyncio.wait([*running, *recoveries], return_when=asyncio.FIRST_COMPLETED)
                for future in finished:
                    if future not in running:
                        continue  # a worker came back (or was lost): the next dispatch sees it
                    group, worker = running.pop(future)
                    worker.in_flight -= len(group.repeats)
                    error = future.exception()
                    if error is None:
                        yield future.result()
                        continue
                    if worker.recovering is None and not worker.lost:
                        worker.recovering = asyncio.ensure_future(self._recover(worker))
                    group.attempts += 1
                    group.errors.append(_describe(error))
                    if group.attempts <= self.options.max_retries:
                        self.report(f"ray: task {group.task.index} lost with its worker ({group.errors[-1]}); "
                                    f"running it again ({group.attempts}/{self.options.max_retries})")
                        waiting.append(group)
                    else:
                        yield [self._failed(group, env_classes[group.task.env_name], repeat) for repeat in group.repeats]
        finally:
            for future in running:
                future.cancel()
            for pool in self._pools.values():
                for worker in pool:
                    if worker.recovering is not None and not worker.recovering.done():
                        worker.recovering.cancel()
                        worker.recovering = None

    def _dispatch(self, waiting: list[_Group], running: dict[asyncio.Future[Any], tuple[_Group, _Worker]]) -> None:
        """Send waiting groups to the least busy worker of their pool while it has room (a group larger
        than a worker's bound goes alone to an idle worker)."""
        blocked: list[_Group] = []
        while waiting:
            group = waiting.pop()
            pool = [worker for worker in self._pools[self._pool_of_env[group.task.env_name]] if self._usable(worker)]
            worker = min(pool, key=lambda candidate: candidate.in_flight) if pool else None
            size = len(group.repeats)
            if worker is None or (worker.in_flight and worker.in_flight + size > self.worker_concurrency):
                blocked.append(group)
                if len(blocked) >= 64:  # every pool is likely full; keep the rest for the next round
                    break
                continue
            worker.in_flight += size
            reference = worker.handle.run_group.remote(group.task, group.repeats, self._journal_spec(group))
            running[asyncio.wrap_future(reference.future())] = (group, worker)
        waiting.extend(reversed(blocked))

    @staticmethod
    def _usable(worker: _Worker) -> bool:
        if worker.recovering is not None and worker.recovering.done():
            worker.lost = not worker.recovering.result()
            worker.recovering = None
        return worker.recovering is None and not worker.lost

    async def _recover(self, worker: _Worker, *, timeout_s: float = 120.0) -> bool:
        """Wait until Ray has restarted a worker that died (True), or has given up on it (False)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                await asyncio.wrap_future(worker.handle.pid.remote().future())
                return True
            except self._ray.exceptions.ActorDiedError as error:
                if "restart" in str(error).lower() and "max" in str(error).lower():
                    return False
            except self._ray.exceptions.RayActorError:
                pass
            await asyncio.sleep(0.5)
        return False

    def _failed(self, group: _Group, env_class: type[Environment], repeat: int) -> RolloutRecord:
        reason = f"Ray worker lost {group.attempts} times (max_retries {self.options.max_retries}); last: {group.errors[-1]}"
        return RolloutRecord(
            task=group.task, repeat_index=repeat, env=env_class.name or group.task.env_name, output=[],
            tokens=Trajectory(prompt_ids=[]).tokens(), reward=0.0, reward_components={}, mask_sample=True,
            failure_kind="infra", failure_reason=reason, finish_reason="failed", turns=0, tool_calls=0, latency_s=0.0,
            model=self.model_name, env_path=f"{env_class.__module__}:{env_class.__qualname__}",
        )

    # -- reporting and shutdown ---------------------------------------------------------------------

    def replica_stats(self) -> dict[str, Any]:
        """Per-replica load, errors and affinity hit rate, added over every live worker."""
        handles = [worker.handle for pool in self._pools.values() for worker in pool]
        if not handles:
            return {}
        parts = []
        for handle in handles:
            try:
                parts.append(self._ray.get(handle.replica_stats.remote(), timeout=10))
            except Exception:  # a dead worker's counters are gone with it
                continue
        return merge_stats(parts)

    def worker_pids(self) -> list[int]:
        return [self._ray.get(worker.handle.pid.remote()) for pool in self._pools.values() for worker in pool]

    def shutdown(self) -> None:
        """Stop the workers (the cluster stays up; `ray.shutdown()` ends a local one)."""
        handles = [worker.handle for pool in self._pools.values() for worker in pool]
        try:
            self._ray.get([handle.close.remote() for handle in handles], timeout=10)
        except Exception:  # a dead or stuck worker is killed all the same
            pass
        for handle in handles:
            self._ray.kill(handle)
        self._pools.clear()
        self._pool_of_env.clear()


def _describe(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def wait_for_workers(rollouts: RayRollouts, *, timeout_s: float = 60.0) -> list[int]:
    """The workers' pids once each answers (a restarted worker answers again); for tests and benchmarks."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return rollouts.worker_pids()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
