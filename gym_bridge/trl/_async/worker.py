"""gym_bridge as TRL's async rollout worker: `AsyncGRPOTrainer(rollout_worker=AsyncRolloutWorker(...))`.

TRL 1.16's `RolloutWorkerProtocol` in the trainer's process: an event loop on a thread runs gym_bridge's engine against
the trainer's vLLM server group by group and pushes one `RolloutSample` per training row; a failed rollout is counted
and left out, never stopping the worker. This module is the protocol surface and the loop; the roles beside it
(`gym_bridge.trl._async`): `admission`, `rows`, `buffer`, `progress`.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from gym_bridge.core.engine import Engine, EngineConfig, ensure_ready
from gym_bridge.core.environment import Environment
from gym_bridge.core.errors import ConfigError
from gym_bridge.core.journal import RolloutKey, RunFingerprint
from gym_bridge.core.policy import Policy
from gym_bridge.core.record import RolloutRecord
from gym_bridge.core.registry import resolve_tasks
from gym_bridge.core.staleness import StalenessWindow
from gym_bridge.core.task import Task
from gym_bridge.core.template.chat_template import ChatTemplate
from gym_bridge.policies.versioned import VersionedPolicy
from gym_bridge.trl._async.admission import ROLLOUT, Admission, ClockedPolicy
from gym_bridge.trl._async.buffer import RolloutBuffer
from gym_bridge.trl._async.ledger import WorkerState
from gym_bridge.trl._async.progress import GroupProgress
from gym_bridge.trl._async.rows import RowMaker
from gym_bridge.trl._async.seams import async_seams
from gym_bridge.trl._async.settings import AsyncWorkerSettings, journal_dir_for, row_budget_for
from gym_bridge.trl._trainer_args import limits_from_args, rows_per_version, sampling_from_args

__all__ = ["AsyncRolloutWorker", "WorkerLink"]

logger = logging.getLogger(__name__)

HEARTBEAT_S = 1.0
"""How often the worker's loop proves it is alive (`check_health`)."""


class WorkerLink:
    """What the trainer's thread and the worker's loop thread share, behind one lock: the policy version, the stop
    flag, the loop's heartbeat and error, and waking the loop (its admission) from the trainer's thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._version = 0
        self._stopping = False
        self._error: BaseException | None = None
        self._heartbeat = time.time()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: Callable[[], None] | None = None

    @property
    def version(self) -> int:
        with self._lock:
            return self._version

    def set_version(self, version: int) -> None:
        with self._lock:
            self._version = version
        self.wake()

    @property
    def stopping(self) -> bool:
        with self._lock:
            return self._stopping

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
        self.wake()

    def attach(self, loop: asyncio.AbstractEventLoop, wake: Callable[[], None]) -> None:
        """The loop's thread runs `loop`; `wake` (run on it) makes it look at its window again."""
        with self._lock:
            self._loop, self._wake = loop, wake

    def wake(self) -> None:
        with self._lock:
            loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            loop.call_soon_threadsafe(wake)

    def call_soon(self, callback: Callable[..., None], *args: Any) -> None:
        """Run `callback(*args)` on the loop's thread (dropped when no loop runs)."""
        with self._lock:
            loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(callback, *args)

    def beat(self) -> None:
        with self._lock:
            self._heartbeat = time.time()

    def fail(self, error: BaseException) -> None:
        with self._lock:
            self._error = error

    def check(self, stale_after_s: float, *, running: bool) -> None:
        """Raise when the loop died, or (`running`) has not ticked for `stale_after_s`."""
        with self._lock:
            error, age = self._error, time.time() - self._heartbeat
        if error is not None:
            raise RuntimeError(f"gym_bridge's rollout worker stopped: {type(error).__name__}: {error}") from error
        if running and age > stale_after_s:
            raise RuntimeError(f"gym_bridge's rollout worker has not ticked for {age:.0f} s (> {stale_after_s:.0f} s)")


class AsyncRolloutWorker:
    """TRL's `RolloutWorkerProtocol` over gym_bridge's engine (see the module docstring).

    `tasks` are the rows to train on (cycled in order, `group_size` rollouts each); `policy` generates
    token-in/token-out (a `RemotePolicy` on the trainer's vLLM server); `template` renders the prompts.
    """

    def __init__(self, tasks: Sequence[Task], policy: Policy, template: ChatTemplate, settings: AsyncWorkerSettings,
                 *, eos_token_ids: Sequence[int] | None = None) -> None:
        if not tasks:
            raise ConfigError("AsyncRolloutWorker needs at least one task")
        self.settings = settings
        self._tasks = list(tasks)
        self.env_classes = resolve_tasks(self._tasks)  # every row routed before anything starts
        ensure_ready(self.env_classes.values())
        self.link = WorkerLink()
        self.policy = VersionedPolicy(policy, lambda: self.link.version)
        self.window = StalenessWindow(settings.max_staleness, settings.rows_per_version)
        self.counts: Counter[str] = Counter()
        """Totals since start: `groups`, `rollouts`, `failed`, `failed/<kind>`, `rows`, `forced_admissions`, `group_errors`."""
        self.admission = Admission(self.window, group_size=settings.group_size, row_version=settings.row_version,
                                   version=lambda: self.link.version, counts=self.counts, row_budget=settings.row_budget)
        config = EngineConfig(sampling=settings.sampling, limits=settings.limits, max_concurrency=settings.max_concurrency,
                              deadline_s=settings.deadline_s, model_name=settings.model_name)
        self._engine = Engine(ClockedPolicy(self.policy, self.admission.clock), template, config)  # checks the template is append-only
        end_of_turn = template.end_of_turn_id
        self.rows = RowMaker(async_seams().rollout_sample, row_version=self.admission.row_version, counts=self.counts,
                             eos_token_ids=(end_of_turn, *(t for t in (eos_token_ids or template.eos_token_ids) if t != end_of_turn)),
                             max_completion_length=settings.limits.max_completion_tokens)
        self.progress = GroupProgress(settings.group_size)
        self.metrics_queue: queue.Queue[dict[str, Any]] = queue.Queue()
        self.rollout_buffer = RolloutBuffer(version=lambda: self.link.version, taken=lambda group_id: self.progress.ledger.taken(group_id),
                                            metrics=self.metrics_queue, records_path=settings.records_path)
        self._thread: threading.Thread | None = None

    # -- RolloutWorkerProtocol ----------------------------------------------------------------------

    def start(self) -> None:
        """Start producing (TRL calls it once, after the first weight sync)."""
        if self._thread is not None:
            return
        self._open_journal()
        self.window.base_version = self.link.version
        self.link.beat()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), name="gym_bridge_async_worker", daemon=True)
        self._thread.start()
        ready.wait()

    def stop(self) -> None:
        """Stop generating, cancel what runs, release the policy's connections; idempotent."""
        self.link.stop()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=30)
        self._thread = None
        self.rollout_buffer.close()

    def update_model_version(self, model_version: int) -> None:
        """The trainer's weights are now `model_version` (called after each sync, the server resumed)."""
        self.link.set_version(int(model_version))

    def check_health(self, stale_after_s: float) -> None:
        """Raise when the worker's loop died or has not ticked for `stale_after_s` (a failed rollout never does this)."""
        self.link.check(stale_after_s, running=self._thread is not None)

    @property
    def model_version(self) -> int:
        return self.link.version

    # -- the trainer's checkpoints ------------------------------------------------------------------

    def follow_checkpoints(self) -> None:
        """The trainer saves checkpoints and gives each one's `checkpoint_state` back on restart: keep a group's
        journal until `checkpoint_saved` says a checkpoint covers its rows (not only until they are pushed), so rows
        pushed or taken after the last checkpoint are continued, not generated again, by the restarted worker."""
        if self._thread is not None:
            raise ConfigError("follow_checkpoints() must be called before the worker starts")
        self.progress.follow_checkpoints = True

    def checkpoint_state(self, *, trained_rows: int | None = None) -> WorkerState:
        """What to save with a checkpoint now: the groups every row of which is among the first `trained_rows` rows the
        trainer took since `start` (None: all it took; a trainer's data loader may take a batch ahead of its steps),
        and the policy version."""
        return self.progress.ledger.state(self.link.version, trained_rows=trained_rows)

    def checkpoint_saved(self, state: WorkerState) -> None:
        """A checkpoint holding `state` is complete: the journal of the groups it covers is dropped."""
        groups = self.progress.ledger.release(state)
        if groups and self.progress.journal is not None:
            self.link.call_soon(self.progress.finish, groups)

    def restore_checkpoint_state(self, state: WorkerState) -> None:
        """Before `start`, on a restarted trainer: go on from `state`'s groups (those it covers are not run again, nor
        continued from the journal) at its policy version. The trainer's own counter must restart from
        `state.model_version` too (`gym_bridge.trl.restore_async_worker` sets both)."""
        if self._thread is not None:
            raise ConfigError("restore_checkpoint_state() must be called before the worker starts")
        self.progress.restore(state)
        self.link.set_version(state.model_version)

    def set_row_budget(self, row_budget: int | None) -> None:
        """Before `start`: the rows the trainer will still take (`AsyncWorkerSettings.row_budget`), e.g. fewer on a
        trainer restarted from a checkpoint whose steps are trained."""
        if self._thread is not None:
            raise ConfigError("set_row_budget() must be called before the worker starts")
        self.settings = replace(self.settings, row_budget=row_budget)
        self.admission.row_budget = row_budget

    def _open_journal(self) -> None:
        """With `journal_dir`: open the journal (resumed) and attach it to the engine; once."""
        if self.settings.journal_dir is None or self.progress.journal is not None:
            return
        fingerprint = RunFingerprint.of_engine(self._engine.config, self._tasks)
        self._engine = self._engine.with_journal(self.progress.open_journal(self.settings.journal_dir, fingerprint))

    @classmethod
    def for_trainer(cls, args: Any, *, tasks: Sequence[Task], tokenizer: Any, served_model: str, num_processes: int = 1,
                    max_turns: int = 8, max_completion_tokens: int | None = None, policy: Policy | None = None,
                    records_path: str | Path | None = None, max_concurrency: int = 64, deadline_s: float = 600.0,
                    journal_dir: str | Path | Literal[False] | None = None, end_of_run: bool = True) -> AsyncRolloutWorker:
        """A worker set from an `AsyncGRPOConfig`: `num_generations`, `max_staleness`, the batch that fixes
        `rows_per_version`, sampling (`sampling_from_args`: `temperature`, `top_p`, `top_k`, `max_completion_length`
        per model call) and `vllm_server_base_url` (a `RemotePolicy` on `served_model`, unless `policy` is given).
        `max_completion_tokens` bounds all turns of a rollout (default: `max_turns` model calls' worth).
        `journal_dir` (`AsyncWorkerSettings.journal_dir`): None (the default) journals to `<output_dir>/rollout_journal`
        when the worker generates on the trainer's vLLM server (no `policy` given), else not; False: never.
        `end_of_run` (default on): stop starting groups once they cover the rows the trainer will take
        (`AsyncWorkerSettings.row_budget`, from `max_steps`), so every episode started is trained."""
        from gym_bridge.policies.remote import RemotePolicy

        per_call, limits = limits_from_args(args, trainer="async", max_turns=max_turns, max_completion_tokens=max_completion_tokens)
        settings = AsyncWorkerSettings(
            group_size=int(args.num_generations), max_staleness=int(args.max_staleness),
            rows_per_version=rows_per_version(args, num_processes=num_processes),
            sampling=sampling_from_args(args, max_new_tokens=per_call, trainer="async"),
            limits=limits,
            max_concurrency=max_concurrency, deadline_s=deadline_s, model_name=served_model,
            records_path=None if records_path is None else str(records_path),
            journal_dir=journal_dir_for(journal_dir, args, over_server=policy is None),
            row_budget=row_budget_for(args) if end_of_run else None,
        )
        if policy is None:
            policy = RemotePolicy(f"{str(args.vllm_server_base_url).rstrip('/')}/v1", model=served_model,
                                  request_timeout_s=float(args.request_timeout), vocab_size=len(tokenizer))
        return cls(tasks, policy, ChatTemplate(tokenizer), settings)

    # -- the loop -----------------------------------------------------------------------------------

    def _serve(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self.link.attach(loop, self.admission.wake)
        loop.call_soon(ready.set)
        try:
            loop.run_until_complete(self._produce())
        except BaseException as error:  # a bug of ours, not a rollout's failure: reported by check_health
            self.link.fail(error)
            logger.exception("gym_bridge's rollout worker stopped")
        finally:
            try:
                if self.progress.journal is not None:
                    loop.run_until_complete(self.progress.journal.close())  # kept while rollouts are left in flight
                loop.run_until_complete(self.policy.aclose())
            finally:
                loop.close()

    async def _produce(self) -> None:
        self.progress.finish(self.progress.covered)
        running: set[asyncio.Task[None]] = set()
        ticker = asyncio.ensure_future(self._tick())
        try:
            for group_id in self.progress.order():
                waited_s = await self.admission.wait(group_id, idle=lambda: not running and self.rollout_buffer.empty(),
                                                     stopping=lambda: self.link.stopping)
                if waited_s is None:
                    break
                self._push_metrics({"gym_bridge/admission_wait_s": waited_s, "gym_bridge/inflight_rows": float(self.window.in_flight_rows)})
                job = asyncio.ensure_future(self._run_group(group_id, self._tasks[group_id % len(self._tasks)]))
                running.add(job)
                job.add_done_callback(running.discard)
        finally:
            ticker.cancel()
            for job in list(running):
                job.cancel()
            await asyncio.gather(ticker, *running, return_exceptions=True)

    async def _tick(self) -> None:
        while True:
            self.link.beat()
            await asyncio.sleep(HEARTBEAT_S)

    async def _rollout(self, task: Task, group_id: int, repeat: int, env_class: type[Environment]) -> RolloutRecord:
        ROLLOUT.set((group_id, repeat))  # this task's own context: the clock counts its calls under this key
        return await self._engine.rollout(task, repeat, env_class=env_class, key=RolloutKey.of_group(group_id, repeat))

    async def _run_group(self, group_id: int, task: Task) -> None:
        pushed = 0
        try:
            env_class = self.env_classes[task.env_name]
            records = list(await asyncio.gather(*(self._rollout(task, group_id, repeat, env_class)
                                                  for repeat in range(self.settings.group_size))))
            group = self.rows.group(group_id, records, env_class)
            self._push_metrics(group.metrics)
            self.progress.pushed(group_id, len(group.rows))  # before the trainer can take the first
            self.rollout_buffer.push(group.rows, left_out=group.left_out)
            pushed = len(group.rows)
            self.progress.done(group_id)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug in building rows must not stop the worker: counted, logged, skipped
            self.counts["group_errors"] += 1
            if not pushed:
                self.progress.pushed(group_id, 0)  # no rows for the trainer: the group is done
            logger.exception("gym_bridge: group %d of task %d could not be turned into rows", group_id, task.index)
            self._push_metrics({"gym_bridge/group_errors_total": 1.0})
        finally:
            self.admission.finish(group_id, pushed)

    def _push_metrics(self, values: dict[str, Any]) -> None:
        self.metrics_queue.put_nowait(values)
