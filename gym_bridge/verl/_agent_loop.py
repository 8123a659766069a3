"""verl adapter: `gym_bridge.verl.GymBridgeAgentLoop`, an agent loop for verl 0.9.1's `AgentLoopWorker`.

Each sample's task runs through the core `Engine` with `VerlServerPolicy` (token ids over
`server_manager.generate`) and the record becomes an `AgentLoopOutput` (`to_agent_loop_output`:
environment tokens masked, failed rollouts kept with an all-zero mask and a flag, never raised).
Both of verl's workers drive it: V1's `AgentLoopWorkerTQ` (verl's default, `trainer.use_v1=true`),
which passes each of the `rollout.n` samples its `session_id`, and the legacy `AgentLoopWorker`,
which repeats the row `n` times. `RolloutSlots` bounds the rollouts one worker runs at once.
`GymBridgeDataset` checks every row when verl loads the data.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar

from gym_bridge.verl._data import check_verl_files, plain, task_from_columns
from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.training_row import to_training_row
from gym_bridge.core.engine import Engine, EngineConfig, ensure_ready
from gym_bridge.core.errors import BackendAnswerError, ConfigError, GenerationAbortedError, MissingExtraError, ContextOverflowError
from gym_bridge.core.health import HealthSettings, ToolCallAlarm
from gym_bridge.core.policy import Generation, GenerationRequest, SamplingParams
from gym_bridge.core.conversation import FinishReason
from gym_bridge.core.record import RolloutRecord, with_train_step
from gym_bridge.core.registry import resolve_tasks
from gym_bridge.core.rollout_file import RolloutWriter
from gym_bridge.core.template.chat_template import ChatTemplate
from gym_bridge.core.template.check import TemplateCheck

try:
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput
    from verl.utils.dataset.rl_dataset import RLHFDataset
except ImportError as error:  # verl, or what its agent loop imports without declaring it (cachetools, fastapi, uvicorn)
    raise MissingExtraError(f"gym_bridge.verl needs verl 0.9.1: pip install 'gym-bridge[verl]' ({error})") from None

__all__ = [
    "REWARD_EXTRA_KEYS", "GymBridgeAgentLoop", "GymBridgeDataset", "RolloutSlots", "VerlServerPolicy", "repeat_index", "to_agent_loop_output",
]

REWARD_EXTRA_KEYS = (
    "gym_bridge_reward", "gym_bridge_masked", "gym_bridge_failed", "gym_bridge_turns", "gym_bridge_tool_calls",
    "gym_bridge_env", "gym_bridge_failure_kind", "gym_bridge_reward_components",
    "gym_bridge_parse_errors", "gym_bridge_unparsed_tool_calls", "gym_bridge_no_answer", "gym_bridge_harness_rewrites",
)
"""`reward_extra_info` keys of every sample, whatever its environment: verl stacks them across a batch
(from the first sample's keys) and logs them. Components are JSON text, since their names differ by environment."""

_templates: dict[int, tuple[Any, ChatTemplate]] = {}
_alarm = ToolCallAlarm(HealthSettings())
"""The tool-call alarm of this agent-loop worker process: it warns once per environment and kind (see `gym_bridge.core.health`)."""
logger = logging.getLogger(__name__)


def template_for(tokenizer: Any) -> ChatTemplate:
    """One chat template per tokenizer and process (its append-only check is then done once)."""
    cached = _templates.get(id(tokenizer))
    if cached is None or cached[0] is not tokenizer:
        cached = _templates[id(tokenizer)] = (tokenizer, ChatTemplate(tokenizer))
    return cached[1]


class VerlServerPolicy:
    """A token-in/token-out `Policy` over verl's `LLMServerClient.generate` for one rollout.

    Every call of the rollout uses one `request_id`, so verl's load balancer keeps them on one server.
    Each call sends verl's sampling parameters plus `max_tokens` (what is left of the response budget);
    the first call's prompt must fit `prompt_length` (else `ContextOverflowError`: a masked sample).
    verl's async trainers park a call in flight for a train step and a weight update (`parks_calls`), and
    its `FullyAsyncLLMServerClient` resumes an aborted generation inside this one call. Each call's
    `policy_version` is the oldest weights version (`min_global_steps`) its tokens were sampled under.
    """

    parks_calls = True
    """verl may hold a call for a whole train step and weight update: not counted in the rollout's deadline."""

    def __init__(self, server_manager: Any, sampling_params: Mapping[str, Any], *, eos_token_ids: Sequence[int],
                 prompt_length: int, request_id: str | None = None) -> None:
        self.server_manager = server_manager
        self.sampling_params = dict(sampling_params)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.prompt_length = prompt_length
        self.request_id = request_id or uuid.uuid4().hex
        self.with_logprobs = bool(self.sampling_params.get("logprobs"))
        self.calls = 0
        self.generate_s = 0.0
        self.num_preempted: int | None = None
        self.global_steps: dict[str, int] = {}
        """`min_global_steps` (the first call's oldest weights) and `max_global_steps` (the last call's newest),
        as verl's server reported them; empty until a call reports them."""

    async def aclose(self) -> None:
        """Nothing to release: the server manager stays with verl."""

    async def generate(self, request: GenerationRequest) -> Generation:
        if self.calls == 0 and len(request.prompt_ids) > self.prompt_length:
            raise ContextOverflowError(f"the prompt has {len(request.prompt_ids)} tokens, more than rollout.prompt_length={self.prompt_length}")
        max_tokens = request.sampling.max_new_tokens
        params = {**self.sampling_params, "max_tokens": max_tokens}
        if request.sampling.stop:
            params["stop"] = list(request.sampling.stop)
        started = time.perf_counter()
        try:
            output = await self.server_manager.generate(request_id=self.request_id, prompt_ids=list(request.prompt_ids), sampling_params=params)
        except ValueError as error:
            if "maximum context length" in str(error):  # verl's server: the prompt leaves no room to generate
                raise ContextOverflowError(str(error)) from None
            raise
        self.generate_s += time.perf_counter() - started
        self.calls += 1
        if output.stop_reason in ("aborted", "abort"):  # the plain client, or partial rollouts off: verl does not resume it
            raise GenerationAbortedError("verl aborted the generation (rollouts paused, e.g. for a weight update)")
        ids = [int(token) for token in output.token_ids]
        logprobs = self._logprobs(output.log_probs, len(ids))
        if output.num_preempted is not None:
            self.num_preempted = (self.num_preempted or 0) + int(output.num_preempted)
        version = self._observe_versions(output.extra_fields or {})
        return Generation(token_ids=ids, logprobs=logprobs, finish_reason=self.finish_reason(ids, request), policy_version=version)

    def _logprobs(self, values: Sequence[float] | None, count: int) -> list[float]:
        """One float per id: 0.0 where none were asked for (`FullyAsyncLLMServerClient` then answers `[]`, the plain client None)."""
        if values is None or (not self.with_logprobs and len(values) != count):
            return [0.0] * count
        if len(values) != count:
            raise BackendAnswerError(f"verl returned {count} token ids but {len(values)} log-probs")
        return [float(value) for value in values]

    def _observe_versions(self, extra: Mapping[str, Any]) -> int | None:
        """Keep the rollout's `min_global_steps` / `max_global_steps` from one call's answer; returns the
        call's version (its `min_global_steps`: under partial rollouts a resumed call spans several)."""
        oldest, newest = _step(extra.get("min_global_steps")), _step(extra.get("max_global_steps"))
        if oldest is not None:
            self.global_steps.setdefault("min_global_steps", oldest)
        if newest is not None:
            self.global_steps["max_global_steps"] = newest
            _reported.latest = newest if _reported.latest is None else max(_reported.latest, newest)
        return oldest

    def finish_reason(self, ids: Sequence[int], request: GenerationRequest) -> FinishReason:
        """`stop` only for a generation that ended on an EOS id (or, with stop strings asked for, one
        shorter than its budget). verl's server answers `stop_reason="completed"` for both vLLM's
        `stop` and `length`, and clamps `max_tokens` to what is left of `max_model_len`, so a
        generation cut there is shorter than the budget asked for: without EOS it is a truncation."""
        if ids and ids[-1] in self.eos_token_ids:
            return "stop"
        if request.sampling.stop and len(ids) < request.sampling.max_new_tokens:
            return "stop"
        return "length"


class _ReportedSteps:
    """The newest weights version (`global_steps`) verl's servers reported to this agent-loop worker process."""

    latest: int | None = None


_reported = _ReportedSteps()


def _step(value: Any) -> int | None:
    """A weights version as verl reports it (an int; None where the server set none yet)."""
    return None if value is None or isinstance(value, bool) else int(value)


def trajectory_steps(policy: VerlServerPolicy, *, dispatch_step: int | None = None) -> dict[str, int]:
    """`min_global_steps` / `max_global_steps` for a sample's `extra_fields`: integers on every output, as
    V1's `AgentLoopWorkerTQ._agent_loop_postprocess` copies them into each sample's TransferQueue tag and
    `PPOTrainer._compute_metrics` casts them with `np.array(..., dtype=int)` (fully async's
    `detach_utils.assemble_batch_from_rollout_samples` subtracts them), where a None raises.

    A rollout whose calls reported versions carries theirs. One that reported none (it failed before its
    first call: a reset error, a prompt over `prompt_length`; or its server sets no version) has no tokens, so
    its version only places it for verl's staleness metrics: the newest version verl's servers reported to this
    worker process (the weights in service as far as it knows); before any report, the weights in service when
    V1 dispatched it (`dispatch_step - 1`: V1 syncs the weights of step k-1 before it dispatches step k's batch);
    else 0 (the initial weights). Both fields get that one value: a span of one version."""
    fallback = _reported.latest
    if fallback is None:
        fallback = max(dispatch_step - 1, 0) if dispatch_step is not None else 0
    oldest = policy.global_steps.get("min_global_steps")
    newest = policy.global_steps.get("max_global_steps")
    oldest = oldest if oldest is not None else (newest if newest is not None else fallback)
    return {"min_global_steps": oldest, "max_global_steps": newest if newest is not None else oldest}


def sampling_from_verl(sampling_params: Mapping[str, Any], *, max_new_tokens: int) -> SamplingParams:
    """verl's sampling parameters in gym_bridge's terms (top_k -1 is off, as 0 is here)."""
    top_k = sampling_params.get("top_k")
    return SamplingParams(
        temperature=float(sampling_params.get("temperature", 1.0)),
        top_p=float(sampling_params.get("top_p", 1.0)),
        top_k=int(top_k) if top_k is not None and int(top_k) > 0 else 0,
        max_new_tokens=max_new_tokens,
        logprobs_mode="processed",  # verl's rollout default (logprobs_mode: processed_logprobs)
    )


class GymBridgeAgentLoop(AgentLoopBase):
    """verl's agent loop for gym_bridge rows (`agent_name: gym_bridge`); see the module docstring.

    Options come from the agent-loop YAML entry: `max_turns`, `deadline_s`, `max_new_tokens_per_turn`,
    `template_check`, `max_concurrency` and `per_env_concurrency` (rollouts at once in one agent-loop
    worker, all environments / one environment; verl runs `rollout.agent.num_workers` workers), and
    `records_path` (append every rollout's record, with its `metrics.train_step`, for `gym-bridge show`
    / `view`; each worker process to its own `records_file`). A row
    naming an unknown environment raises (a configuration error that `GymBridgeDataset` reports at
    load time); anything that goes wrong while a rollout runs is a masked output.
    """

    def __init__(self, *args: Any, max_turns: int = 8, deadline_s: float = 600.0, generation_timeout_s: float = 3600.0,
                 max_new_tokens_per_turn: int | None = None, template_check: TemplateCheck = "error", max_concurrency: int = 64,
                 per_env_concurrency: int | None = None, records_path: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)
        self.max_turns = int(max_turns)
        self.deadline_s = float(deadline_s)
        self.generation_timeout_s = float(generation_timeout_s)
        self.max_new_tokens_per_turn = max_new_tokens_per_turn
        self.template_check = template_check
        self.template = template_for(self.tokenizer)
        self.records_path = records_file(records_path) if records_path else None
        self.slots = RolloutSlots.shared(max_concurrency=int(max_concurrency),
                                         per_env_concurrency=int(per_env_concurrency) if per_env_concurrency else None)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        index = int(plain(kwargs.get("index", 0)) or 0)
        task = task_from_columns(kwargs, index=index, source=f"verl row {index}")
        repeat = repeat_index(kwargs)
        env_class = resolve_tasks([task])[task.env_name]
        ensure_ready([env_class])
        eos = sorted(self.template.eos_token_ids)
        policy = VerlServerPolicy(self.server_manager, sampling_params, eos_token_ids=eos, prompt_length=self.prompt_length)
        per_turn = min(self.max_new_tokens_per_turn or self.response_length, self.response_length)
        config = EngineConfig(
            sampling=sampling_from_verl(sampling_params, max_new_tokens=per_turn),
            limits=Limits(max_turns=self.max_turns, max_completion_tokens=self.response_length),
            deadline_s=self.deadline_s, generation_timeout_s=self.generation_timeout_s, template_check=self.template_check,
        )
        async with self.slots.hold(task.env_name):
            record = await Engine(policy, self.template, config).rollout(task, repeat, env_class=env_class)
        _alarm.observe(record)
        dispatch = plain(kwargs.get("global_steps"))  # V1: the trainer step the sample was dispatched for
        steps = trajectory_steps(policy, dispatch_step=int(dispatch) if dispatch is not None else None)
        if self.records_path is not None:
            # the weights version of the rollout's first call (see trajectory_steps for one that made none)
            _records_writer(self.records_path).write(with_train_step(record.to_dict(), steps["min_global_steps"]))
        return to_agent_loop_output(record, policy=policy, prompt_length=self.prompt_length, response_length=self.response_length,
                                    global_steps=steps)


_writers: dict[Path, RolloutWriter] = {}
"""One open records file per path in this worker process (verl builds an agent loop per sample); each line is flushed."""


def _records_writer(path: Path) -> RolloutWriter:
    writer = _writers.get(path)
    if writer is None:
        writer = _writers[path] = RolloutWriter(path, append=True)
    return writer


def records_file(records_path: str) -> Path:
    """This agent-loop worker process's file for `records_path`: `<stem>.<host>-<pid>.jsonl` beside it
    (verl runs several worker processes, on several nodes; each appends to its own)."""
    path = Path(records_path)
    return path.with_name(f"{path.stem}.{socket.gethostname()}-{os.getpid()}.jsonl")


def repeat_index(columns: Mapping[str, Any]) -> int:
    """Which of the row's `rollout.n` samples this is: verl V1's `session_id` (0..n-1); the legacy
    worker passes none (it repeats the row), so there the samples of one `uid` are counted in this
    process, in the order they start (a group split across two workers counts from 0 in each)."""
    session = plain(columns.get("session_id"))
    if session is not None:
        return int(session)
    uid = plain(columns.get("uid"))
    if uid is None:
        return 0
    started = _legacy_repeats.pop(str(uid), 0)
    _legacy_repeats[str(uid)] = started + 1
    while len(_legacy_repeats) > 65536:
        _legacy_repeats.popitem(last=False)
    return started


_legacy_repeats: OrderedDict[str, int] = OrderedDict()


class RolloutSlots:
    """The bound on rollouts one agent-loop worker runs at once (verl builds an agent loop per sample,
    so the bound lives here, one per process and event loop, not in a per-rollout `Engine`)."""

    _shared: ClassVar[dict[tuple[int, int | None], RolloutSlots]] = {}

    def __init__(self, *, max_concurrency: int, per_env_concurrency: int | None) -> None:
        if max_concurrency < 1 or (per_env_concurrency is not None and per_env_concurrency < 1):
            raise ConfigError(f"max_concurrency and per_env_concurrency must be positive, got {max_concurrency} and {per_env_concurrency}")
        self.max_concurrency = max_concurrency
        self.per_env_concurrency = per_env_concurrency
        self.in_flight = 0
        self.peak = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._global: asyncio.Semaphore | None = None
        self._per_env: dict[str, asyncio.Semaphore] = {}

    @classmethod
    def shared(cls, *, max_concurrency: int, per_env_concurrency: int | None) -> RolloutSlots:
        """The process's slots for these bounds, stated in the log when first made."""
        key = (max_concurrency, per_env_concurrency)
        slots = cls._shared.get(key)
        if slots is None:
            slots = cls._shared[key] = cls(max_concurrency=max_concurrency, per_env_concurrency=per_env_concurrency)
            logger.warning("gym_bridge agent loop: at most %d rollouts at once in this worker%s", max_concurrency,
                           f", {per_env_concurrency} per environment" if per_env_concurrency else "")
        return slots

    @asynccontextmanager
    async def hold(self, env_name: str) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._global, self._per_env = loop, asyncio.Semaphore(self.max_concurrency), {}
        assert self._global is not None
        env_slot = self._per_env.setdefault(env_name, asyncio.Semaphore(self.per_env_concurrency)) if self.per_env_concurrency else None
        if env_slot is not None:  # first, so a rollout waiting for its environment holds no global slot
            await env_slot.acquire()
        try:
            async with self._global:
                self.in_flight += 1
                self.peak = max(self.peak, self.in_flight)
                try:
                    yield
                finally:
                    self.in_flight -= 1
        finally:
            if env_slot is not None:
                env_slot.release()


def to_agent_loop_output(record: RolloutRecord, *, policy: VerlServerPolicy, prompt_length: int, response_length: int,
                         global_steps: Mapping[str, int] | None = None) -> AgentLoopOutput:
    """A record as verl's `AgentLoopOutput`: `response_mask` 1 on sampled tokens, 0 on environment tokens
    (log-prob 0.0 there), `reward_score` from the verifier, `extra_fields["reward_extra_info"]` with
    `REWARD_EXTRA_KEYS`. A masked record (a failure, or a sample its verifier masked) keeps its tokens
    with mask all 0, `reward_score` 0.0 and `extra_fields["gym_bridge_masked"] = True` plus its failure
    kind, so verl drops it from the loss. The token rules are every trainer's, `core.training_row.to_training_row`
    (an empty completion becomes one EOS id with mask 0; a harness that rewrote its history gives its last
    segment, and `gym_bridge_harness_rewrites` counts the earlier, untrained ones); here the row is cut to
    verl's prompt and response lengths. `extra_fields` always holds integer `min_global_steps` /
    `max_global_steps` (`global_steps`, else `trajectory_steps(policy)`)."""
    row = to_training_row(record, eos_token_ids=sorted(policy.eos_token_ids), max_completion_length=response_length)
    masked = row.masked
    prompt_ids = list(row.prompt_ids[-prompt_length:])  # longer only for a masked context overflow
    components = dict(row.reward_components)
    reward_extra_info = {
        "gym_bridge_reward": float(record.reward), "gym_bridge_masked": float(masked), "gym_bridge_failed": float(record.failed),
        "gym_bridge_turns": record.turns, "gym_bridge_tool_calls": record.tool_calls, "gym_bridge_env": record.env,
        "gym_bridge_failure_kind": record.failure_kind or "", "gym_bridge_reward_components": json.dumps(components, sort_keys=True),
        "gym_bridge_parse_errors": record.parse_errors, "gym_bridge_unparsed_tool_calls": record.unparsed_tool_calls,
        "gym_bridge_no_answer": float(record.finish_reason != "answer" and not record.failed),
        "gym_bridge_harness_rewrites": row.harness_rewrites,
    }
    extra_fields: dict[str, Any] = {
        "reward_extra_info": reward_extra_info, "gym_bridge_masked": masked, "gym_bridge_failure_kind": record.failure_kind,
        "gym_bridge_failure_reason": record.failure_reason, "gym_bridge_finish_reason": record.finish_reason,
        "gym_bridge_repeat_index": record.repeat_index,
        "turn_scores": [], "tool_rewards": [], **(global_steps if global_steps is not None else trajectory_steps(policy)),
    }
    return AgentLoopOutput(
        prompt_ids=prompt_ids,
        response_ids=list(row.completion_ids[:response_length]),
        response_mask=list(row.completion_mask[:response_length]),
        response_logprobs=list(row.completion_logprobs[:response_length]) if policy.with_logprobs else None,
        reward_score=0.0 if row.reward is None else row.reward,
        num_turns=1 + record.turns + _tool_rounds(record),
        metrics=AgentLoopMetrics(generate_sequences=policy.generate_s, tool_calls=max(0.0, record.latency_s - policy.generate_s),
                                 num_preempted=policy.num_preempted if policy.num_preempted is not None else -1),
        extra_fields=extra_fields,
    )


def _tool_rounds(record: RolloutRecord) -> int:
    """How many times tool outputs went back to the model (runs of `function_call_output` items)."""
    rounds, previous = 0, None
    for item in record.output:
        kind = item["type"]
        rounds += kind == "function_call_output" and previous != "function_call_output"
        previous = kind
    return rounds


class GymBridgeDataset(RLHFDataset):
    """verl's `RLHFDataset` that checks, when the data loads, every row (its task parses and routes to an
    installed environment whose tools match: DataError `file:row N: field` or UnknownEnvironmentError).
    Use it with `data.custom_cls.path=pkg://gym_bridge.verl
    data.custom_cls.name=GymBridgeDataset`."""

    def __init__(self, data_files: str | Sequence[str], tokenizer: Any, config: Any, processor: Any = None, max_samples: int = -1) -> None:
        files = [data_files] if isinstance(data_files, str) else [str(path) for path in data_files]
        check_verl_files(files)
        super().__init__(files, tokenizer, config, processor, max_samples)

