"""Evaluation runs: pick tasks, run them through the engine, write records and metrics.

This is what `gym-bridge eval` and `gym-bridge verify` do, as functions a script can call.
Everything that can be wrong with the input (rows, routing, tools, the template) is checked
before the first generation; records stream to the output file as they finish.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Iterable, Protocol, Sequence

from gym_bridge.core.errors import describe_error, ConfigError, DataError, UnknownEnvironmentError, classify
from gym_bridge.core.engine import ensure_ready, ready_tasks
from gym_bridge.core.environment import Environment, row_problems
from gym_bridge.core.journal import RolloutKey, RunFingerprint, RunJournal, journal_dir_for, open_journal
from gym_bridge.core.health import HealthSettings, ToolCallAlarm, tool_call_health
from gym_bridge.core.metrics import summarize
from gym_bridge.core.record import RolloutRecord
from gym_bridge.core.registry import TaskSet, get_environment, remote_url, resolve_tasks
from gym_bridge.core.rollout_file import RolloutWriter, input_row, keep_only, locked_output, read_records, resume_records
from gym_bridge.core.session import EnvironmentSession
from gym_bridge.core.task import Task, iter_jsonl, parse_task, routing_name
from gym_bridge.core.trust import DEFAULT_TRUST, TrustSettings
from gym_bridge.eval.progress import RunObserver


def select_tasks(*, env_names: Sequence[str] = (), data_paths: Sequence[str | Path] = (), limit: int | None = None,
                 trust: TrustSettings = DEFAULT_TRUST) -> list[Task]:
    """Tasks from environments' example data and/or JSONL files, at most `limit` per environment.

    With both, `env_names` become the default environment of rows that name none. Every name in
    `env_names` is looked up first, so a typo fails even when the rows name their environment, and
    a module path (`pkg.mod:Class`) registers its class under its `name`, which rows may then use.
    Each row is checked like `gym-bridge data validate` does (routing, tools, the environment's
    `row_schema` / `validate_row`, and what `trust` does not let run). Raises DataError / UnknownEnvironmentError before
    anything runs.
    """
    return list(_selected(env_names, data_paths, limit, trust).tasks)


def select_ready_tasks(*, env_names: Sequence[str] = (), data_paths: Sequence[str | Path] = (), limit: int | None = None,
                       trust: TrustSettings = DEFAULT_TRUST) -> TaskSet:
    """`select_tasks`, routed once and with each environment ready (`check_ready`): the `TaskSet` an
    eval run checks once and hands to `run_eval`. Raises what `select_tasks` and `check_ready` raise."""
    selected = _selected(env_names, data_paths, limit, trust)
    ensure_ready(selected.env_classes.values())
    return selected


def _selected(env_names: Sequence[str], data_paths: Sequence[str | Path], limit: int | None, trust: TrustSettings) -> TaskSet:
    """The tasks of `select_tasks`, routed and row-checked under `trust` (not yet `check_ready`)."""
    for name in env_names:
        get_environment(name, trust)
    sources: list[tuple[Path, str | None]] = []
    if data_paths:
        default_env = env_names[0] if len(env_names) == 1 else None
        sources = [(Path(path), default_env) for path in data_paths]
    else:
        for name in env_names:
            env_class = get_environment(name, trust)
            if env_class.example_data is None:
                raise DataError(f"environment {name!r} ships no example data; pass --data FILE.jsonl")
            sources.append((Path(env_class.example_data), env_class.name))
    if not sources:
        raise DataError("nothing to evaluate: pass --env NAME or --data FILE.jsonl")
    tasks: list[Task] = []
    per_env: Counter[str] = Counter()
    for path, default_env in sources:
        if not path.exists():
            raise DataError("file not found", source=str(path))
        for line_number, row in iter_jsonl(path):
            task = parse_task(row, index=len(tasks), source=f"{path}:{line_number}", default_env=default_env)
            if limit is not None and per_env[task.env_name] >= limit:
                continue
            per_env[task.env_name] += 1
            tasks.append(task)
    env_classes = resolve_tasks(tasks, trust)
    check_rows(tasks, env_classes, trust)
    return TaskSet(tuple(tasks), env_classes)


def check_rows(tasks: Sequence[Task], env_classes: dict[str, type[Environment]], trust: TrustSettings = DEFAULT_TRUST) -> None:
    """Raise DataError for the first row its environment rejects (`row_problems`: `validate_row`, `row_schema`, and what
    `trust` does not let run), counting the rest."""
    problems: list[tuple[Task, str, str]] = []
    for task in tasks:
        env_class = env_classes[task.env_name]
        try:
            found = [(problem.field, problem.message) for problem in row_problems(env_class, task.row, trust)]
        except Exception as error:
            found = [("(row)", f"{env_class.__name__}.validate_row crashed: {describe_error(error)}")]
        problems.extend((task, field, f"{message} (environment {env_class.name!r})") for field, message in found)
    if problems:
        task, field, message = problems[0]
        more = f"; {len(problems) - 1} more problem(s): `gym-bridge data validate FILE` lists them all" if len(problems) > 1 else ""
        raise DataError(message + more, source=task.source, field=field)


@dataclass(frozen=True)
class EvalResult:
    summary: dict[str, Any]
    output: Path
    metrics_path: Path


RESUMABLE_FAILURES = frozenset({"infra"})
"""Failure kinds whose committed turns stay in the journal, so `--resume` (which runs failed rollouts again) continues
them from their last turn: a model server or the network that failed for a while (the common loss in long agentic
evals) says nothing against the turns before it. Other kinds start over: the environment, the verifier or the deadline
failed the episode itself."""


def metrics_path_for(output: str | Path) -> Path:
    output = Path(output)
    return output.with_name(output.stem + ".metrics.json")


class RolloutSource(Protocol):
    """What `run_eval` runs: the local `Engine`, or `gym_bridge.scale.ray_runner.RayRollouts`."""

    def stream(self, tasks: Sequence[Task] | TaskSet, *, repeats: int = 1,
               skip: Iterable[tuple[int, int]] = ()) -> AsyncIterator[RolloutRecord]: ...

    def journal_fingerprint(self, tasks: TaskSet, *, repeats: int) -> RunFingerprint:
        """What a journal of this run depends on (the model, the tasks, the settings that shape a rollout)."""
        ...

    def with_journal(self, journal: RunJournal | None) -> RolloutSource:
        """This source, committing each rollout's turns to `journal` under `RolloutKey.of_task` (None: to none)."""
        ...

    def replica_stats(self) -> dict[str, Any]:
        """Per-replica calls, errors, load and the episode-affinity hit rate, where the policy routes over model
        servers (Ray workers' routers added together); else {}."""
        ...


def replica_metrics(engine: RolloutSource) -> dict[str, Any]:
    """`{"replicas": ...}` from the run's `replica_stats`, where there are any; else `{}`."""
    stats = engine.replica_stats()
    return {"replicas": stats} if stats else {}


async def run_eval(
    engine: RolloutSource,
    tasks: Sequence[Task] | TaskSet,
    *,
    output: str | Path,
    num_repeats: int = 1,
    resume: bool = False,
    observer: RunObserver | None = None,
    health: HealthSettings | None = None,
    journal: bool | None = None,
) -> EvalResult:
    """Run every (task, repeat) not already in `output` and write records plus `.metrics.json`.

    With `journal` (a local `Engine`, or Ray workers: `RayRollouts`), rollouts commit each finished turn to `<output>.journal/`, and a run with
    `resume` continues the episodes a killed run left in flight from their last finished turn (`gym_bridge.core.resume`).
    None: on only when resuming a run that left a journal (`gym-bridge eval` turns it on where a server generates).

    `observer` (a progress bar: `gym_bridge.eval.progress.RunProgress`) is told when the rollouts start, of each
    record written, and when the run stops. Tool-call health is watched as records arrive (`health`: when to warn, see `ToolCallAlarm`);
    the summary holds it under `tool_call_health` and the warnings raised under `alarms`.

    Tasks given as a `TaskSet` (`select_ready_tasks`) are not routed or checked again. Raises
    OutputLockedError when another process is writing `output`, JournalError for a journal that cannot be
    used (before any rollout) or that cannot be written any more (a full disk: the run stops, records
    written so far and committed turns kept for `resume`).
    """
    ready = ready_tasks(tasks)  # a refused run (no sandbox, say) leaves `output` as it was
    with locked_output(output):
        return await run_eval_locked(engine, ready, output=output, num_repeats=num_repeats, resume=resume, observer=observer,
                                     health=health, journal=journal)


async def run_eval_locked(
    engine: RolloutSource,
    tasks: TaskSet,
    *,
    output: str | Path,
    num_repeats: int = 1,
    resume: bool = False,
    observer: RunObserver | None = None,
    health: HealthSettings | None = None,
    journal: bool | None = None,
) -> EvalResult:
    """`run_eval` for a caller that holds `locked_output(output)` already (the CLI takes it before loading
    a model) and has checked its tasks once (`select_ready_tasks`). The summary is computed from the
    records in memory (those a resumed run kept, then this run's), not by reading `output` back."""
    output = Path(output)
    kept = resume_records(output, tasks.tasks) if resume else {}
    skip = set(kept)
    if journal is None:
        journal = resume and journal_dir_for(output).exists()
    if resume:
        check_repeats(kept, num_repeats=num_repeats, output=output)
    run_journal = None
    if journal:
        run_journal = open_journal(journal_dir_for(output), engine.journal_fingerprint(tasks, repeats=num_repeats),
                                   mode="resume" if resume else "fresh", finished={RolloutKey.of_task(*key) for key in skip})
        engine = engine.with_journal(run_journal)
    if resume and output.exists():  # checked: now the failed records go, to be run again
        keep_only(output, kept.values())
    started, cpu_started = time.perf_counter(), time.process_time()
    this_run: list[dict[str, Any]] = []
    alarm = ToolCallAlarm(health or HealthSettings())
    complete, kept_in_journal = False, 0
    if observer is not None:
        observer.started(tasks, repeats=num_repeats)
    try:
        with RolloutWriter(output, append=resume) as writer:
            async for record in engine.stream(tasks, repeats=num_repeats, skip=skip):
                if run_journal is not None and run_journal.failure is not None:
                    raise run_journal.failure  # a journal folder that cannot be written (full) stops the run once
                row = record.to_dict()
                writer.write(row)
                if run_journal is not None:
                    if record.failure_kind in RESUMABLE_FAILURES:
                        kept_in_journal += 1
                    else:
                        run_journal.finish(RolloutKey.of_task(record.task_index, record.repeat_index))
                this_run.append(row)
                alarm.observe(row)
                if observer is not None:
                    observer.record_done(row)
        complete = not kept_in_journal
    finally:
        if observer is not None:
            observer.finished()
        if run_journal is not None:
            await run_journal.close(complete=complete)
    wall_s, cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    records = [*kept.values(), *this_run]
    summary = summarize(records, wall_s=wall_s, this_run=this_run, num_repeats=num_repeats)
    summary["tool_call_health"], summary["alarms"] = tool_call_health(records), alarm.alarms
    summary["cpu_s"] = round(cpu_s, 3)  # this process's CPU time over the run: what generation costs the client
    summary.update(replica_metrics(engine))
    metrics_path = metrics_path_for(output)
    metrics_path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return EvalResult(summary=summary, output=output, metrics_path=metrics_path)


def check_repeats(kept: Iterable[tuple[int, int]], *, num_repeats: int, output: Path) -> None:
    """Raise ConfigError when `output` holds repeats this run's `num_repeats` would not run (a resume that forgot
    `--num-repeats` left some tasks with fewer repeats than others, and dropped the episodes in flight)."""
    highest = max((repeat for _, repeat in kept), default=-1)
    if highest >= num_repeats:
        raise ConfigError(f"--num-repeats changed: {output} holds repeat {highest} of a task, so its run had --num-repeats "
                          f"{highest + 1} or more, and this run has --num-repeats {num_repeats}; resume with the same "
                          "--num-repeats, or choose a new --output")


def record_environment(record: dict[str, Any], source: str, trust: TrustSettings = DEFAULT_TRUST) -> type[Environment]:
    """The environment class of a stored record: by its `env` name, else its row's routing, else
    the `env_path` (`module:Class`) it was run with, module paths only where `trust` allows them. Raises
    UnknownEnvironmentError naming `source`."""
    name = record.get("env") or parse_task(input_row(record), index=0, source=source).env_name
    names = [name, routing_name(input_row(record)), record.get("env_path")]
    errors = []
    for candidate in dict.fromkeys(candidate for candidate in names if candidate):
        try:
            return get_environment(candidate, trust)
        except UnknownEnvironmentError as error:
            errors.append(str(error))
    raise UnknownEnvironmentError(f"{source}: {'; '.join(errors)}")


async def _rescore(record: dict[str, Any], env_class: type[Environment], source: str) -> dict[str, Any]:
    """A record re-scored by its environment's verifier. Rollouts that failed before verify
    (infra, env, timeout, context_overflow) have no trajectory to score and are kept as they are."""
    if record.get("failure_kind") not in (None, "verifier"):
        return record
    task = parse_task(input_row(record), index=record.get("task_index", 0), source=source, default_env=record.get("env"))
    if remote_url(task.row):  # rows with agent_ref.remote go to their server
        env_class = resolve_tasks([task])[task.env_name]
    session = EnvironmentSession(env_class)
    rescored = dict(record)
    try:
        await session.setup(task)
        result = await session.verify(task, record["response"].get("output") or [])
        rescored.update(
            reward=result.reward, reward_components=result.reward_components or {"reward": result.reward},
            mask_sample=result.mask_sample, failure_kind=result.failure_kind, failure_reason=result.failure_reason,
        )
        rescored["metrics"] = {**record.get("metrics", {}), "verify": dict(result.metrics)}
    except Exception as error:  # whatever failed, the re-scoring did: the verifier's failure, re-scored next time
        reason = classify(error, step="verify", timeout_s=env_class.verify_timeout_s).reason
        rescored.update(reward=0.0, reward_components={}, mask_sample=True, failure_kind="verifier", failure_reason=reason)
    finally:
        await session.close()  # the score stands: a failing close does not stop the other records
    return rescored


async def rescore_file(data: str | Path, *, output: str | Path, concurrency: int = 16,
                       trust: TrustSettings = DEFAULT_TRUST) -> dict[str, Any]:
    """Re-score stored rollouts with their environments' verifiers (no model), finding each record's environment under
    `trust` (`record_environment`); returns metrics."""
    records = read_records(data)
    env_classes = []
    for position, record in enumerate(records):
        if "response" not in record:
            raise DataError("is not a rollout record (it has no 'response')", source=f"{data}:{position + 1}")
        env_classes.append(record_environment(record, f"{data}:{position + 1}", trust))
    slots = asyncio.Semaphore(concurrency)

    async def one(position: int, record: dict[str, Any]) -> dict[str, Any]:
        async with slots:
            return await _rescore(record, env_classes[position], f"{data}:{position + 1}")

    with locked_output(output):
        rescored = await asyncio.gather(*(one(i, record) for i, record in enumerate(records)))
        with RolloutWriter(output, append=False) as writer:
            for record in rescored:
                writer.write(record)
        summary = summarize(rescored)
        metrics_path_for(output).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary
