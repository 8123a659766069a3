"""TRL adapter: `GRPOTrainer(rollout_func=gym_bridge.trl.rollout, reward_funcs=gym_bridge.trl.env_reward)`.

TRL 1.16 calls the rollout function on every rank with that rank's `prompt` values, each
already repeated `num_generations` times, and takes back one row per prompt: `prompt_ids`,
`completion_ids`, `logprobs`, `env_mask` (1 model token, 0 environment token) and any per-row
lists, which reach reward functions as keywords. Here each prompt is mapped back to its task
(see `trl_dataset`), the generation backend is picked once per trainer (the trainer's vLLM
engine, a vLLM server over HTTP from every rank, or the trainer's own model), the whole batch
runs concurrently through the core `Engine`, and the records are translated. No rollout logic
lives here.

This module owns the rollout function (`TRLRollout`, `make_rollout`, `rollout`) and the translation to
TRL's rows (`to_trl_batch`, over `core.training_row.to_training_row`); `trl_backend` picks the generation
backend, `trl_rewards` holds the reward function and its metrics, `trl_dataset` maps prompts to tasks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gym_bridge.trl._options import RolloutOptions
from gym_bridge.trl._backend import LOOP, BackendName, generation_context, on_ray, pick_backend, release_policy
from gym_bridge.trl._dataset import REGISTRY, key_from_prompt
from gym_bridge.trl._step_journal import StepJournal
from gym_bridge.trl._trainer_args import limits_from_args, sampling_from_args
from gym_bridge.core.training_row import TrainingRow, to_training_row
from gym_bridge.core.items import item_text
from gym_bridge.core.engine import Engine, EngineConfig, ready_tasks
from gym_bridge.core.environment import Environment
from gym_bridge.core.errors import ConfigError, DataError, SetupError, TokenPolicyRequiredError
from gym_bridge.core.health import ToolCallAlarm
from gym_bridge.core.journal import RolloutKey
from gym_bridge.core.template.parsers import get_reasoning_parser, get_tool_parser
from gym_bridge.core.record import RolloutRecord, with_train_step
from gym_bridge.core.task import Task, parse_task
from gym_bridge.core.template.chat_template import ChatTemplate

if TYPE_CHECKING:
    from gym_bridge.scale.ray_runner import RayRollouts

__all__ = ["TRLRollout", "make_rollout", "rollout", "to_trl_batch"]

logger = logging.getLogger(__name__)

ROW_KEYS = (
    "prompt_ids", "completion_ids", "logprobs", "env_mask",
    "env_reward", "reward_components", "failure_kind", "env_name", "num_turns", "tool_calls", "finish_reason",
    "parse_errors", "unparsed_tool_calls", "harness_rewrites",
)
"""The keys `rollout` returns; all but the first four reach reward functions as keywords."""
NOT_A_TASK = "build the dataset with gym_bridge.trl.load_dataset, whose prompts carry each task's key"



@dataclass
class _TrainerState:
    """What a rollout function keeps per trainer: backend, engine and the tasks seen."""

    backend: BackendName
    engine: Engine
    eos_token_ids: tuple[int, ...]
    max_completion_length: int
    tasks: dict[str, tuple[Task, type[Environment]]] = dataclasses.field(default_factory=dict)
    datasets_indexed: bool = False
    batches: int = 0
    alarm: ToolCallAlarm = dataclasses.field(default_factory=ToolCallAlarm)
    ray: RayRollouts | None = None
    """Set with `RolloutOptions(ray=...)`: the batch runs on these Ray workers instead of `engine`."""
    journal: StepJournal | None = None
    """Set with `RolloutOptions(journal_dir=...)`: `engine` commits each turn there."""


class TRLRollout:
    """A TRL `rollout_func`: `rollout(prompts, trainer) -> dict` (see `ROW_KEYS`).

    Build one with `make_rollout(**options)`; `gym_bridge.trl.rollout` is the one with defaults.
    """

    def __init__(self, options: RolloutOptions) -> None:
        self.options = options
        self._states: weakref.WeakKeyDictionary[Any, _TrainerState] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"TRLRollout({self.options})"

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        """Run one rollout per prompt and return TRL's rows, in the order of `prompts`.

        Raises (before generating) for a prompt that names no known task, an unknown
        environment, `tools=` given to the trainer, or a backend that cannot give token ids.
        A rollout that fails while running is a masked row, never an exception.
        """
        state = self.prepare(trainer)
        jobs = self._tasks(state, prompts, trainer)
        repeats = repeat_indices(prompts, group_size=_group_size(trainer), offset=_rank(trainer) * len(prompts))
        keys = None
        if state.journal is not None and not state.journal.ended:
            keys = state.journal.keys(int(trainer.state.global_step), len(jobs))
            LOOP.run(state.journal.begin(keys))
        with generation_context(state.backend, trainer):
            if state.ray is not None:
                records = LOOP.run(state.ray.run_pairs([(task, repeat) for (task, _), repeat in zip(jobs, repeats)]))
            else:
                records = LOOP.run(_run_all(state.engine, jobs, repeats, keys))
        _check_token_ids(records)
        if state.batches == 0 and records and all(record.failed for record in records):
            first = records[0]
            raise SetupError(
                f"every rollout of the first batch failed; the first as {first.failure_kind}: {first.failure_reason}"
            )
        state.batches += 1
        rows = [to_training_row(record, max_completion_length=state.max_completion_length, eos_token_ids=state.eos_token_ids)
                for record in records]
        _watch(records, rows, state.alarm, path=self.options.records_path, trainer=trainer)
        if self.options.on_records is not None:
            self.options.on_records(records)
        return _trl_columns(rows)

    def prepare(self, trainer: Any) -> _TrainerState:
        """Pick the backend, check the template and the trainer's settings; cached per trainer.

        Call it after building the trainer to fail before training starts rather than at the
        first batch. Raises ValueError, GymBridgeError or MissingDependencyError naming the fix.
        """
        with self._lock:
            state = self._states.get(trainer)
            if state is None:
                state = self._states[trainer] = self._new_state(trainer)
        return state

    def check_dataset(self, trainer: Any, dataset: Any = None) -> int:
        """Check that every prompt of `dataset` (default: the trainer's train dataset) names a known
        task routed to a known environment; returns the number of distinct tasks. Raises DataError
        or UnknownEnvironmentError for the first that does not."""
        state = self.prepare(trainer)
        dataset = trainer.train_dataset if dataset is None else dataset
        prompts = list(dataset["prompt"]) if "prompt" in (getattr(dataset, "column_names", None) or []) else []
        self._tasks(state, prompts, trainer)
        return len({key_from_prompt(prompt) for prompt in prompts})

    def _new_state(self, trainer: Any) -> _TrainerState:
        options, args = self.options, trainer.args
        _check_trainer(trainer)
        max_completion_length = options.max_completion_length or getattr(args, "max_completion_length", None)
        if not max_completion_length:
            raise ConfigError("set GRPOConfig(max_completion_length=...): gym_bridge enforces it over all turns of a rollout")
        tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
        eos_token_ids = tuple(getattr(trainer, "eos_token_ids", None) or [tokenizer.eos_token_id])
        backend, policy = pick_backend(trainer, options)
        template = ChatTemplate(tokenizer, tool_format=options.tool_format, eos_token_ids=eos_token_ids, tool_parser=options.tool_parser,
                                reasoning_parser=options.reasoning_parser, chat_template_kwargs=options.chat_template_kwargs)
        per_call, limits = limits_from_args(args, trainer="sync", max_turns=options.max_turns, max_completion_length=max_completion_length,
                                            max_new_tokens_per_turn=options.max_new_tokens_per_turn,
                                            max_tool_output_chars=options.max_tool_output_chars)
        config = EngineConfig(
            sampling=sampling_from_args(args, max_new_tokens=per_call, trainer="sync"),
            limits=limits,
            max_concurrency=options.max_concurrency,
            per_env_concurrency=options.per_env_concurrency,
            deadline_s=options.deadline_s,
            model_name=str(getattr(getattr(trainer.model, "config", None), "_name_or_path", "") or ""),
            template_check=options.template_check,
        )
        engine = Engine(policy, template, config)  # checks the template is append-only
        end_of_turn = template.end_of_turn_id
        eos_token_ids = (end_of_turn, *(token for token in eos_token_ids if token != end_of_turn))  # appended first by to_trl_batch
        if backend != "policy":  # a policy built here is released with its trainer; one passed in is its owner's
            weakref.finalize(trainer, release_policy, policy)
        logger.info("gym_bridge.trl: generating with the %s backend (%s)", backend, type(policy).__name__)
        if options.journal_dir is not None and options.ray is not None:
            raise ConfigError("make_rollout(journal_dir=...) journals rollouts run in the trainer's process; with ray=..., drop journal_dir")
        journal = StepJournal.open(options.journal_dir, rank=_rank(trainer), config=config) if options.journal_dir is not None else None
        engine = engine.with_journal(journal.journal if journal is not None else None)
        return _TrainerState(backend=backend, engine=engine, eos_token_ids=eos_token_ids, max_completion_length=max_completion_length,
                             alarm=ToolCallAlarm(options.health),
                             ray=on_ray(options, backend, policy, template, config), journal=journal)

    def _tasks(self, state: _TrainerState, prompts: Sequence[Any], trainer: Any) -> list[tuple[Task, type[Environment]]]:
        """The task and environment class of each prompt, kept per trainer: a row new to this trainer is
        parsed once (not at all when `load_dataset` parsed it in this process), and a batch's new rows are
        routed in one pass with their environments checked ready once."""
        keys: list[str] = []
        new: dict[str, Task] = {}
        for prompt in prompts:
            key = key_from_prompt(prompt)
            if key is None:
                raise DataError(f"prompt {_short(prompt)} does not identify a gym_bridge task; {NOT_A_TASK}")
            keys.append(key)
            if key not in state.tasks and key not in new:
                new[key] = self._new_task(state, key, prompt, trainer)
        if new:
            env_classes = ready_tasks(new.values()).env_classes
            state.tasks.update((key, (task, env_classes[task.env_name])) for key, task in new.items())
        return [state.tasks[key] for key in keys]

    def _new_task(self, state: _TrainerState, key: str, prompt: Any, trainer: Any) -> Task:
        entry = REGISTRY.get(key)
        if entry is None and not state.datasets_indexed:
            for dataset in _trainer_datasets(trainer):
                REGISTRY.add_dataset(dataset)
            state.datasets_indexed = True
            entry = REGISTRY.get(key)
        if entry is None:
            raise DataError(
                f"prompt {_short(prompt)} carries task key {key}, which is neither in the trainer's datasets nor among "
                f"the rows loaded in this process; {NOT_A_TASK}"
            )
        return entry.task or parse_task(entry.row, index=entry.position, source=entry.source)


def make_rollout(**options: Any) -> TRLRollout:
    """A TRL rollout function with settings (see `RolloutOptions` for each keyword).

    Raises TypeError for an unknown keyword, UnknownParserError (listing the known names) for an
    unknown `tool_parser` or `reasoning_parser`.
    """
    if isinstance(options.get("server_base_urls"), (list, tuple)):
        options["server_base_urls"] = tuple(options["server_base_urls"])
    if options.get("tool_parser") is not None:
        get_tool_parser(options["tool_parser"])
    if options.get("reasoning_parser") is not None:
        get_reasoning_parser(options["reasoning_parser"])
    return TRLRollout(RolloutOptions(**options))


rollout = make_rollout()
"""The default rollout function: `GRPOTrainer(..., rollout_func=gym_bridge.trl.rollout)`."""


# -- translation -------------------------------------------------------------------------------


def to_trl_batch(records: Sequence[RolloutRecord], *, eos_token_ids: Sequence[int], max_completion_length: int) -> dict[str, list[Any]]:
    """TRL's rollout output for `records`, one row each, in order.

    Each row is `core.training_row.to_training_row` (masked rows: `env_mask` all 0 and `env_reward` None;
    an empty completion: one EOS id; an answer without EOS: one appended; a harness's last segment,
    with `harness_rewrites` logged as `gym_bridge/harness_rewrites`) under TRL's keys.
    """
    return _trl_columns([to_training_row(record, max_completion_length=max_completion_length, eos_token_ids=eos_token_ids)
                         for record in records])


def _trl_columns(rows: Sequence[TrainingRow]) -> dict[str, list[Any]]:
    """TRL's rollout output for training rows already made (one conversion per record and batch)."""
    batch: dict[str, list[Any]] = {key: [] for key in ROW_KEYS}
    for row in rows:
        for key, value in _trl_row(row).items():
            batch[key].append(value)
    return batch


def _trl_row(row: TrainingRow) -> dict[str, Any]:
    """A training row under TRL's keys (`ROW_KEYS`)."""
    return {
        "prompt_ids": list(row.prompt_ids), "completion_ids": list(row.completion_ids), "logprobs": list(row.completion_logprobs),
        "env_mask": list(row.completion_mask), "env_reward": row.reward, "reward_components": dict(row.reward_components),
        "failure_kind": row.failure_kind, "env_name": row.env_name, "num_turns": row.turns, "tool_calls": row.tool_calls,
        "finish_reason": row.finish_reason, "parse_errors": row.parse_errors, "unparsed_tool_calls": row.unparsed_tool_calls,
        "harness_rewrites": row.harness_rewrites,
    }


def repeat_indices(prompts: Sequence[Any], *, group_size: int, offset: int = 0) -> list[int]:
    """The repeat index of each prompt within its GRPO group.

    TRL lays out a generation batch as consecutive groups of `group_size` equal prompts and
    gives each rank a contiguous slice starting at `offset`, so a group may begin on an earlier
    rank. When the prompts do not follow that layout, equal neighbours are counted instead.
    """
    indices = [(offset + i) % group_size for i in range(len(prompts))] if group_size > 0 else []
    aligned = bool(indices) and all(
        prompts[i] == prompts[i - 1] for i in range(1, len(prompts)) if indices[i] != 0
    )
    if aligned:
        return indices
    counted, run = [], 0
    for i in range(len(prompts)):
        run = run + 1 if i and prompts[i] == prompts[i - 1] else 0
        counted.append(run)
    return counted


async def _run_all(engine: Engine, jobs: Sequence[tuple[Task, type[Environment]]], repeats: Sequence[int],
                   keys: Sequence[RolloutKey] | None = None) -> list[RolloutRecord]:
    keyed = keys if keys is not None else [None] * len(jobs)
    return list(await asyncio.gather(*(engine.rollout(task, repeat, env_class=env_class, key=key)
                                       for (task, env_class), repeat, key in zip(jobs, repeats, keyed))))


def _watch(records: Sequence[RolloutRecord], rows: Sequence[TrainingRow], alarm: ToolCallAlarm, *, path: str | None,
           trainer: Any) -> None:
    """Feed the tool-call alarm (it warns once per kind and environment) from the batch's training `rows`, and
    append the records, with the trainer's step, to `path`: a record becomes its JSONL line only when one is
    written (a recipe's `on_records` that writes them converts each once, not twice)."""
    for record, row in zip(records, rows):
        alarm.observe(_health_view(record, row))
    if path is not None:
        from pathlib import Path

        from gym_bridge.core.rollout_file import RolloutWriter

        step = getattr(getattr(trainer, "state", None), "global_step", None)
        rank = _rank(trainer)
        target = Path(path) if rank == 0 else Path(path).with_name(f"{Path(path).stem}.rank{rank}.jsonl")
        with RolloutWriter(target, append=True) as writer:
            for record in records:
                writer.write(with_train_step(record.to_dict(), step))


def _health_view(record: RolloutRecord, row: TrainingRow) -> dict[str, Any]:
    """The fields of a record's JSONL line that the tool-call alarm reads (`core.health`), from its training row."""
    task_row = record.task.row
    return {
        "env": row.env_name, "env_path": record.env_path, "failure_kind": row.failure_kind,
        "responses_create_params": task_row.get("responses_create_params"), "tools": task_row.get("tools"),
        "metrics": {"tool_calls": row.tool_calls, "parse_errors": row.parse_errors, "unparsed_tool_calls": row.unparsed_tool_calls,
                    "finish_reason": row.finish_reason},
    }


def _check_token_ids(records: Sequence[RolloutRecord]) -> None:
    for record in records:
        for item in record.output:
            if item.get("generation_token_ids") == [] and item.get("type") == "message" and item_text(item):
                raise TokenPolicyRequiredError(
                    "the policy returned text without token ids; training needs a token-in/token-out policy "
                    "(TransformersPolicy, VLLMEnginePolicy, RemotePolicy)"
                )


# -- the trainer's side ------------------------------------------------------------------------


def _check_trainer(trainer: Any) -> None:
    if getattr(trainer, "tools", None) or getattr(trainer, "environment_factories", None) is not None:
        raise ConfigError(
            "GRPOTrainer got tools= (or environment_factory=) together with gym_bridge.trl.rollout; remove them: "
            "gym_bridge runs each task's environment and tools itself, and TRL would run its own tool loop on top"
        )


def _group_size(trainer: Any) -> int:
    training = getattr(getattr(trainer, "model", None), "training", True)
    size = getattr(trainer, "num_generations" if training else "num_generations_eval", None)
    return int(size or getattr(trainer.args, "num_generations", 1) or 1)


def _rank(trainer: Any) -> int:
    accelerator = getattr(trainer, "accelerator", None)
    return int(getattr(accelerator, "process_index", 0) or 0)


def _trainer_datasets(trainer: Any) -> Iterator[Any]:
    for dataset in (getattr(trainer, "train_dataset", None), getattr(trainer, "eval_dataset", None)):
        if isinstance(dataset, Mapping):
            yield from dataset.values()
        elif dataset is not None:
            yield dataset


def _short(prompt: Any) -> str:
    text = repr(prompt)
    return text if len(text) <= 120 else text[:117] + "..."
