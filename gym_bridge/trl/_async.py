"""gym_bridge as TRL's async rollout worker: `AsyncGRPOTrainer(rollout_worker=AsyncRolloutWorker(...))`.

It implements TRL 1.16's `RolloutWorkerProtocol` in the trainer's process: an event loop on a thread
runs gym_bridge's engine against the trainer's vLLM server (token-in `/v1/completions`, the append-only
token stream), group by group over rows that name their environment, scores each rollout with its
environment's verifier, computes group advantages over the scored rollouts only, and pushes one
`RolloutSample` per training row (one per token segment of a harness that rewrote its history). A
failed rollout is left out of the loss and of its group's statistics, counted in the metrics, and never
stops the worker. An episode goes on across weight syncs; its rows carry its last model call's version
(`row_version`, `gym_bridge.trl._async_admission`), and groups start only while `StalenessWindow` says their
rows will still be fresh enough when the trainer reaches them; every model call records its policy version
(`VersionedPolicy`). Roles: admission and row versions (`_async_admission`), records -> rows and advantages
(`_async_rows`), the trainer's checkpoints (`_async_ledger`, `_async_checkpoint`), this module the loop. With a
journal (`journal_dir`), a worker started again after its trainer restarted continues the groups left in flight
from their last turn, each earlier turn keeping the policy version it was generated with; following the trainer's
checkpoints (`follow_checkpoints`, `checkpoint_state`, `restore_checkpoint_state`), it also keeps a group's journal
until a checkpoint covers its rows and goes on from the checkpoint's groups.
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from gym_bridge.trl._async_admission import ROLLOUT, CallClock, ClockedPolicy, RowVersion
from gym_bridge.trl._async_api import async_seams
from gym_bridge.trl._async_ledger import GroupLedger, WorkerState
from gym_bridge.trl._async_rows import TrainingSegment, group_advantages, last_text, training_segments
from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.engine import Engine, EngineConfig, ensure_ready
from gym_bridge.core.environment import Environment
from gym_bridge.core.journal import RolloutKey, RunFingerprint, RunJournal, open_journal
from gym_bridge.core.policy import Policy, SamplingParams
from gym_bridge.core.record import RolloutRecord, with_consumed_version
from gym_bridge.core.registry import resolve_tasks
from gym_bridge.core.rollout_file import RolloutWriter
from gym_bridge.core.staleness import StalenessWindow
from gym_bridge.core.task import Task
from gym_bridge.core.template.chat_template import ChatTemplate
from gym_bridge.policies.versioned import VersionedPolicy
from gym_bridge.core.errors import ConfigError

__all__ = ["AsyncRolloutWorker", "AsyncWorkerSettings"]

logger = logging.getLogger(__name__)

HEARTBEAT_S = 1.0
"""How often the worker's loop proves it is alive (`check_health`)."""


@dataclass(frozen=True)
class AsyncWorkerSettings:
    """How the worker generates and how far ahead of the trainer it may run."""

    group_size: int
    """Rollouts per task (TRL's `num_generations`)."""
    max_staleness: int
    """The trainer's `max_staleness`: rows whose version (`row_version`) is older than this are dropped, so none is generated."""
    rows_per_version: int
    """Rows the trainer takes at least per version: samples per optimizer step times `weight_sync_steps`."""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    limits: Limits = field(default_factory=Limits)
    max_concurrency: int = 64
    """Rollouts running at once (the window may allow fewer)."""
    deadline_s: float = 600.0
    model_name: str = ""
    records_path: str | None = None
    """Append each rollout's record (with `metrics.consumed_version`) when the trainer takes its first row."""
    row_version: RowVersion = "last_call"
    """Which version a row carries for TRL's `max_staleness` (`gym_bridge.trl._async_admission`): its last model
    call's (a long episode goes on across weight syncs and is kept) or its first call's (its oldest token's)."""
    journal_dir: str | None = None
    """Commit each finished turn of the rollouts in flight here (`gym_bridge.core.journal`): a worker started over the
    same directory (the trainer restarted from its checkpoint) first runs the groups left in flight, each rollout from
    its last committed turn with its earlier turns' policy versions, then goes on with the groups after them."""

    def __post_init__(self) -> None:
        if self.row_version not in get_args(RowVersion):
            raise ConfigError(f"row_version must be one of {', '.join(map(repr, get_args(RowVersion)))}, got {self.row_version!r}")
        if self.group_size < 1:
            raise ConfigError(f"group_size (num_generations) must be at least 1, got {self.group_size}")
        if self.group_size > (self.max_staleness + 1) * self.rows_per_version:
            raise ConfigError(f"a group of {self.group_size} rows never fits in (max_staleness + 1) * rows_per_version = "
                             f"{(self.max_staleness + 1) * self.rows_per_version} rows: set AsyncGRPOConfig(token_budget=0) (then a step "
                             "takes per_device_train_batch_size rows per rank), or raise max_staleness or the batch size")


def rows_per_version(args: Any, *, num_processes: int = 1) -> int:
    """Rows an `AsyncGRPOConfig` trainer consumes at least between two weight syncs. With `token_budget=0` each
    micro-batch holds exactly `per_device_train_batch_size` rows per rank; with a token budget (TRL's default) as many
    as fit, at least one per rank, which is the count used (safe, but it admits less: prefer `token_budget=0`)."""
    per_micro_batch = int(args.per_device_train_batch_size) if args.token_budget is not None and args.token_budget <= 0 else 1
    return per_micro_batch * num_processes * int(args.gradient_accumulation_steps) * int(args.weight_sync_steps)


def _journal_dir(given: str | Path | Literal[False] | None, args: Any, *, over_server: bool) -> str | None:
    """`for_trainer`'s journal: as given (False: none), else on where a server generates (a commit costs about 1%
    there), in `<output_dir>/rollout_journal` beside the trainer's checkpoints."""
    if given is None and over_server and getattr(args, "output_dir", None):
        return str(Path(args.output_dir) / "rollout_journal")
    return str(given) if given else None


class _ConsumedQueue(queue.Queue[Any]):
    """The rollout buffer: a plain queue that tells the worker when the trainer takes a row."""

    def __init__(self, on_get: Any) -> None:
        super().__init__()
        self._on_get = on_get

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        item = super().get(block, timeout)
        self._on_get(item)
        return item


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
        self._env_classes = resolve_tasks(self._tasks)  # every row routed before anything starts
        ensure_ready(self._env_classes.values())
        self._version = 0
        self._policy = VersionedPolicy(policy, lambda: self._version)
        self._clock = CallClock(lambda: self._version, on_change=self._wake_admission)
        config = EngineConfig(sampling=settings.sampling, limits=settings.limits, max_concurrency=settings.max_concurrency,
                              deadline_s=settings.deadline_s, model_name=settings.model_name)
        self._engine = Engine(ClockedPolicy(self._policy, self._clock), template, config)  # checks the template is append-only
        end_of_turn = template.end_of_turn_id
        self._eos_token_ids = (end_of_turn, *(token for token in (eos_token_ids or template.eos_token_ids) if token != end_of_turn))
        self.rollout_buffer: queue.Queue[Any] = _ConsumedQueue(self._on_consumed)
        self.metrics_queue: queue.Queue[dict[str, Any]] = queue.Queue()
        self.window = StalenessWindow(settings.max_staleness, settings.rows_per_version)
        self._sample_class: Any = async_seams().rollout_sample
        self._records: dict[int, tuple[dict[str, Any], bool]] = {}
        """id(sample) -> (record row, whether it is the rollout's first row)."""
        self._writer = RolloutWriter(settings.records_path, append=True) if settings.records_path else None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stopping = threading.Event()
        self._error: BaseException | None = None
        self._heartbeat = time.time()
        self.counts: Counter[str] = Counter()
        """Totals since start: `groups`, `rollouts`, `failed`, `failed/<kind>`, `rows`, `forced_admissions`."""
        self._journal: RunJournal | None = None
        self._resumed_groups: list[int] = []
        """Group ids a killed worker left in flight in the journal: run first, continued from their last turn."""
        self._covered_groups: list[int] = []
        """Group ids the journal holds that the restored checkpoint says the trainer took: dropped from it at start."""
        self._ledger = GroupLedger()
        self._follow_checkpoints = False
        self._admitted: set[int] = set()
        """Groups in the window now (the loop's own)."""

    # -- RolloutWorkerProtocol ----------------------------------------------------------------------

    def start(self) -> None:
        """Start producing (TRL calls it once, after the first weight sync)."""
        if self._thread is not None:
            return
        if self.settings.journal_dir is not None and self._journal is None:
            fingerprint = RunFingerprint.of_engine(self._engine.config, self._tasks)
            self._journal = open_journal(self.settings.journal_dir, fingerprint)
            pending = sorted({group_id for group_id, _ in self._journal.pending()})
            start = self._ledger.start
            self._covered_groups = [group_id for group_id in pending if start is not None and start.covers(group_id)]
            self._resumed_groups = [group_id for group_id in pending if group_id not in self._covered_groups]
            self._engine = self._engine.with_journal(self._journal)
        self.window.base_version = self._version
        self._heartbeat = time.time()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), name="gym_bridge_async_worker", daemon=True)
        self._thread.start()
        ready.wait()

    def stop(self) -> None:
        """Stop generating, cancel what runs, release the policy's connections; idempotent."""
        self._stopping.set()
        loop, thread = self._loop, self._thread
        if loop is not None and not loop.is_closed() and self._wake is not None:
            loop.call_soon_threadsafe(self._wake.set)
        if thread is not None:
            thread.join(timeout=30)
        self._thread = None
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    def update_model_version(self, model_version: int) -> None:
        """The trainer's weights are now `model_version` (called after each sync, the server resumed)."""
        self._version = int(model_version)
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            loop.call_soon_threadsafe(wake.set)

    def check_health(self, stale_after_s: float) -> None:
        """Raise when the worker's loop died or has not ticked for `stale_after_s` (a failed rollout never does this)."""
        if self._error is not None:
            raise RuntimeError(f"gym_bridge's rollout worker stopped: {type(self._error).__name__}: {self._error}") from self._error
        age = time.time() - self._heartbeat
        if self._thread is not None and age > stale_after_s:
            raise RuntimeError(f"gym_bridge's rollout worker has not ticked for {age:.0f} s (> {stale_after_s:.0f} s)")

    @property
    def model_version(self) -> int:
        return self._version

    # -- the trainer's checkpoints ------------------------------------------------------------------

    def follow_checkpoints(self) -> None:
        """The trainer saves checkpoints and gives each one's `checkpoint_state` back on restart: keep a group's
        journal until `checkpoint_saved` says a checkpoint covers its rows (not only until they are pushed), so rows
        pushed or taken after the last checkpoint are continued, not generated again, by the restarted worker."""
        if self._thread is not None:
            raise ConfigError("follow_checkpoints() must be called before the worker starts")
        self._follow_checkpoints = True

    def checkpoint_state(self, *, trained_rows: int | None = None) -> WorkerState:
        """What to save with a checkpoint now: the groups every row of which is among the first `trained_rows` rows the
        trainer took since `start` (None: all it took; a trainer's data loader may take a batch ahead of its steps),
        and the policy version."""
        return self._ledger.state(self._version, trained_rows=trained_rows)

    def checkpoint_saved(self, state: WorkerState) -> None:
        """A checkpoint holding `state` is complete: the journal of the groups it covers is dropped."""
        groups = self._ledger.release(state)
        loop = self._loop
        if groups and self._journal is not None and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._finish_groups, groups)

    def restore_checkpoint_state(self, state: WorkerState) -> None:
        """Before `start`, on a restarted trainer: go on from `state`'s groups (those it covers are not run again, nor
        continued from the journal) at its policy version. The trainer's own counter must restart from
        `state.model_version` too (`gym_bridge.trl.restore_async_worker` sets both)."""
        if self._thread is not None:
            raise ConfigError("restore_checkpoint_state() must be called before the worker starts")
        self._ledger = GroupLedger(state)
        self._version = state.model_version

    def _finish_groups(self, groups: Sequence[int]) -> None:
        if self._journal is not None:
            for group_id in groups:
                for repeat in range(self.settings.group_size):
                    self._journal.finish(RolloutKey.of_group(group_id, repeat))

    @classmethod
    def for_trainer(cls, args: Any, *, tasks: Sequence[Task], tokenizer: Any, served_model: str, num_processes: int = 1,
                    max_turns: int = 8, max_completion_tokens: int | None = None, policy: Policy | None = None,
                    records_path: str | Path | None = None, max_concurrency: int = 64, deadline_s: float = 600.0,
                    journal_dir: str | Path | Literal[False] | None = None) -> AsyncRolloutWorker:
        """A worker set from an `AsyncGRPOConfig`: `num_generations`, `max_staleness`, the batch that fixes
        `rows_per_version`, sampling (`temperature`, `top_p`, `top_k`, `max_completion_length` per model call) and
        `vllm_server_base_url` (a `RemotePolicy` on `served_model`, unless `policy` is given).
        `max_completion_tokens` bounds all turns of a rollout (default: `max_turns` model calls' worth).
        `journal_dir` (`AsyncWorkerSettings.journal_dir`): None (the default) journals to `<output_dir>/rollout_journal`
        when the worker generates on the trainer's vLLM server (no `policy` given), else not; False: never."""
        from gym_bridge.policies.remote import RemotePolicy

        per_call = int(args.max_completion_length)
        settings = AsyncWorkerSettings(
            group_size=int(args.num_generations), max_staleness=int(args.max_staleness),
            rows_per_version=rows_per_version(args, num_processes=num_processes),
            sampling=SamplingParams(temperature=float(args.temperature), top_p=float(args.top_p), top_k=int(args.top_k or 0),
                                    max_new_tokens=per_call, logprobs_mode="raw" if float(args.temperature) == 1.0 else "processed"),
            limits=Limits(max_turns=max_turns, max_completion_tokens=max_completion_tokens or per_call * max_turns),
            max_concurrency=max_concurrency, deadline_s=deadline_s, model_name=served_model,
            records_path=None if records_path is None else str(records_path),
            journal_dir=_journal_dir(journal_dir, args, over_server=policy is None),
        )
        if policy is None:
            policy = RemotePolicy(f"{str(args.vllm_server_base_url).rstrip('/')}/v1", model=served_model,
                                  request_timeout_s=float(args.request_timeout), vocab_size=len(tokenizer))
        template = ChatTemplate(tokenizer)
        return cls(tasks, policy, template, settings)

    # -- the loop -----------------------------------------------------------------------------------

    def _serve(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        self._wake = asyncio.Event()
        loop.call_soon(ready.set)
        try:
            loop.run_until_complete(self._produce())
        except BaseException as error:  # a bug of ours, not a rollout's failure: reported by check_health
            self._error = error
            logger.exception("gym_bridge's rollout worker stopped")
        finally:
            try:
                if self._journal is not None:
                    loop.run_until_complete(self._journal.close())  # kept while rollouts are left in flight
                loop.run_until_complete(self._policy.aclose())
            finally:
                loop.close()

    async def _produce(self) -> None:
        self._finish_groups(self._covered_groups)
        running: set[asyncio.Task[None]] = set()
        ticker = asyncio.ensure_future(self._tick())
        try:
            for group_id, task in self._groups():
                if not await self._admit(group_id, running):
                    break
                job = asyncio.ensure_future(self._run_group(group_id, task, self._version))
                running.add(job)
                job.add_done_callback(running.discard)
        finally:
            ticker.cancel()
            for job in list(running):
                job.cancel()
            await asyncio.gather(ticker, *running, return_exceptions=True)

    def _groups(self) -> Iterator[tuple[int, Task]]:
        """Group ids and their rows: the groups a killed worker left in flight first, then on from the restored
        checkpoint's groups (or from the one after the last resumed group)."""
        return ((group_id, self._tasks[group_id % len(self._tasks)]) for group_id in self._ledger.order(self._resumed_groups))

    async def _tick(self) -> None:
        while True:
            self._heartbeat = time.time()
            await asyncio.sleep(HEARTBEAT_S)

    async def _admit(self, group_id: int, running: set[asyncio.Task[None]]) -> bool:
        """Wait until the window admits the group; False when stopping. With nothing in flight and nothing
        queued the trainer can only wait for rows, so the group is admitted anyway (counted, never a deadlock)."""
        assert self._wake is not None
        rows, started = self.settings.group_size, time.perf_counter()
        while not self._stopping.is_set():
            self._advance_floors()
            if self.window.admits(rows, self._version):
                break
            if not running and self.rollout_buffer.empty():
                self.counts["forced_admissions"] += 1
                break
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=0.5)
            except TimeoutError:
                pass
        else:
            return False
        waited_s = time.perf_counter() - started
        self.window.admit(group_id, self._version, rows)
        self._admitted.add(group_id)
        self._push_metrics({"gym_bridge/admission_wait_s": waited_s, "gym_bridge/inflight_rows": float(self.window.in_flight_rows)})
        return True

    def _advance_floors(self) -> None:
        """Under `"last_call"`, raise each group's bound in the window to the lowest version its rows can still carry."""
        if self.settings.row_version != "last_call":
            return
        for group_id in self._admitted:
            floor = min(self._clock.floor((group_id, repeat)) for repeat in range(self.settings.group_size))
            self.window.advance(group_id, floor)

    def _wake_admission(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _rollout(self, task: Task, group_id: int, repeat: int, env_class: type[Environment]) -> RolloutRecord:
        ROLLOUT.set((group_id, repeat))  # this task's own context: the clock counts its calls under this key
        return await self._engine.rollout(task, repeat, env_class=env_class, key=RolloutKey.of_group(group_id, repeat))

    def _row_version(self, group_id: int, repeat: int, record: RolloutRecord) -> int:
        """The version rollout `repeat` of `group_id`'s rows carry (see `AsyncWorkerSettings.row_version`)."""
        if self.settings.row_version == "first_call":
            return min(record.policy_versions) if record.policy_versions else self._version
        returned = self._clock.returned_at((group_id, repeat))
        if returned is not None:
            return returned
        return max(record.policy_versions) if record.policy_versions else self._version  # every call replayed from the journal

    async def _run_group(self, group_id: int, task: Task, version: int) -> None:
        pushed = 0
        try:
            env_class = self._env_classes[task.env_name]
            records = list(await asyncio.gather(*(self._rollout(task, group_id, repeat, env_class)
                                                  for repeat in range(self.settings.group_size))))
            samples = self._samples(group_id, records, env_class)
            self._ledger.pushed(group_id, len(samples))  # before the trainer can take the first
            for sample in samples:
                sample.enqueued_at = time.time()
                self.rollout_buffer.put_nowait(sample)
            pushed = len(samples)
            if not self._follow_checkpoints:
                self._finish_groups([group_id])
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug in building rows must not stop the worker: counted, logged, skipped
            self.counts["group_errors"] += 1
            if not pushed:
                self._ledger.pushed(group_id, 0)  # no rows for the trainer: the group is done
            logger.exception("gym_bridge: group %d of task %d could not be turned into rows", group_id, task.index)
            self._push_metrics({"gym_bridge/group_errors_total": 1.0})
        finally:
            self.window.finish(group_id, pushed)
            self._admitted.discard(group_id)
            self._clock.forget(group_id, self.settings.group_size)
            if self._wake is not None:
                self._wake.set()

    def _samples(self, group_id: int, records: list[RolloutRecord], env_class: type[Environment]) -> list[Any]:
        group = group_advantages(records)
        advantages, mean, std = group.by_position, group.mean, group.std
        samples: list[Any] = []
        for position, record in enumerate(records):
            self.counts["rollouts"] += 1
            if position not in advantages:
                self.counts["failed"] += 1
                self.counts[f"failed/{record.failure_kind or 'masked'}"] += 1
                self._write_now(record)
                continue
            row = record.to_dict()
            metrics = {"reward": float(record.reward), "reward_std": std, f"rewards/{env_class.name}": float(record.reward),
                       "gym_bridge/turns": float(record.turns), "gym_bridge/tool_calls": float(record.tool_calls)}
            version = self._row_version(group_id, position, record)
            oldest = min(record.policy_versions, default=version)
            metrics["gym_bridge/row_version_span"] = float(max(version - oldest, 0))
            for index, segment in enumerate(training_segments(record, eos_token_ids=self._eos_token_ids,
                                                              max_completion_length=self.settings.limits.max_completion_tokens)):
                sample = self._sample(record, segment, advantages[position], version, group_id, metrics)
                self._records[id(sample)] = (row, index == 0)
                samples.append(sample)
        self.counts["groups"] += 1
        self.counts["rows"] += len(samples)
        self._push_metrics(self._group_metrics(records, env_class, mean, len(samples)))
        return samples

    def _sample(self, record: RolloutRecord, segment: TrainingSegment, advantage: float, version: int, group_id: int,
                metrics: Mapping[str, float]) -> Any:
        import numpy as np

        return self._sample_class(
            prompt=[dict(message) for message in record.task.messages],
            completion=[{"role": "assistant", "content": last_text(record)}],
            input_ids=np.asarray(segment.input_ids, dtype=np.int64),
            completion_mask=np.asarray(segment.completion_mask, dtype=np.int64),
            old_log_probs=np.asarray(segment.old_log_probs, dtype=np.float32),
            advantage=float(advantage), model_version=int(version), group_id=int(group_id), metrics=dict(metrics),
        )

    def _group_metrics(self, records: list[RolloutRecord], env_class: type[Environment], mean: float, rows: int) -> dict[str, Any]:
        name = env_class.name
        failed = [record for record in records if record.mask_sample]
        values: dict[str, Any] = {
            "gym_bridge/rollouts_total": float(len(records)),
            "gym_bridge/failed_total": float(len(failed)),
            "gym_bridge/rows_total": float(rows),
            f"gym_bridge/failed_rate/{name}": (float(len(failed)), float(len(records))),
            "gym_bridge/tool_calls_per_rollout": (float(sum(record.tool_calls for record in records)), float(len(records))),
            "gym_bridge/parse_errors_total": float(sum(record.parse_errors for record in records)),
            "gym_bridge/unparsed_tool_calls_total": float(sum(record.unparsed_tool_calls for record in records)),
            f"gym_bridge/rollouts_with_tool_call/{name}": (float(sum(record.tool_calls > 0 for record in records)), float(len(records))),
        }
        if not math.isnan(mean):
            values[f"gym_bridge/reward/{name}"] = mean
        for kind, count in Counter(record.failure_kind or "masked" for record in failed).items():
            values[f"gym_bridge/failures/{kind}_total"] = float(count)
        return values

    # -- consumption (the trainer's thread) ---------------------------------------------------------

    def _on_consumed(self, sample: Any) -> None:
        """The trainer took `sample` at the current version: its staleness goes to the metrics, its record to the file."""
        staleness = self._version - int(sample.model_version)
        oldest = staleness + int(sample.metrics.get("gym_bridge/row_version_span", 0))
        self._ledger.taken(int(sample.group_id))
        self._push_metrics({"gym_bridge/staleness_max": float(staleness), "gym_bridge/staleness_mean": float(staleness),
                            "gym_bridge/oldest_token_staleness_max": float(oldest)})
        with self._lock:
            row, first = self._records.pop(id(sample), (None, False))
            if row is not None and first and self._writer is not None:
                self._writer.write(with_consumed_version(row, self._version))

    def _write_now(self, record: RolloutRecord) -> None:
        with self._lock:
            if self._writer is not None:
                self._writer.write(record.to_dict())

    def _push_metrics(self, values: dict[str, Any]) -> None:
        self.metrics_queue.put_nowait(values)

