"""NeMo RL's native way in: `GymBridgeEnvironment`, an `EnvironmentInterface` for NeMo RL's own rollout loop.

NeMo RL generates each turn and calls `step`; each sample's turn is fed to its core rollout, which
runs tools, limits and the verifier, and the step returns the chat template's rendering of what the
environment added (the observation NeMo RL tokenizes), or the reward when the rollout ended.
NeMo RL is imported only when installed; otherwise an `EnvironmentReturn` of its shape is used.

Masking: NeMo RL does not read the `mask_sample` this path puts in the metadata of a finished sample
(on any version), so a failed rollout trains as reward 0 here. On the `/run` path
(`gym_bridge.serve.agent_server`, its result written by `gym_bridge.core.dialects.nemo_gym`) NeMo RL v0.7.0
ignores `instance_config.mask_sample` and `reward_components` too; main after v0.7.0 reads them (docs/training/nemo-rl.md gives the commits).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from gym_bridge.core.loop_thread import LoopThread
from gym_bridge.verl._data import row_from_columns
from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.dialects.template_view import task_template_messages
from gym_bridge.core.engine import Engine, EngineConfig, ensure_ready
from gym_bridge.core.environment import Environment
from gym_bridge.core.errors import FAILURE_KINDS, ConfigError, DataError
from gym_bridge.core.trajectory import final_text
from gym_bridge.core.policy import ChatRequest
from gym_bridge.core.turn import Turn
from gym_bridge.core.record import RolloutRecord
from gym_bridge.core.registry import resolve_tasks
from gym_bridge.core.task import Task, parse_task
from gym_bridge.core.template.chat_template import ChatTemplate, ToolFormat
from gym_bridge.core.template.check import check_append_only
from gym_bridge.policies.http import RequestTimeoutError

try:  # NeMo RL is not on the package index; its classes are used when it is installed
    from nemo_rl.environments.interfaces import EnvironmentInterface as _Interface
    from nemo_rl.environments.interfaces import EnvironmentReturn
except ImportError:
    _Interface = object

    class EnvironmentReturn(NamedTuple):  # type: ignore[no-redef]  # stands in for nemo_rl's (no stubs, not on PyPI)
        """The shape of `nemo_rl.environments.interfaces.EnvironmentReturn` (all fields batched)."""

        observations: list[dict[str, str]]
        metadata: list[Any]
        next_stop_strings: list[list[str] | None] | list[None]
        rewards: Any
        terminateds: Any
        answers: list[str | None] | None


__all__ = ["ENV_NAME", "EnvironmentReturn", "GymBridgeEnvironment", "TurnFeed", "datum_from_row", "register"]

ENV_NAME = "gym_bridge"
SESSION_KEY = "gym_bridge_session"
ROW_KEY = "gym_bridge_row"
_LOOP = LoopThread()


class TurnFeed:
    """The chat policy of NeMo RL-driven rollouts: each call hands its request out to `step` and waits
    for the assistant turn NeMo RL generated next (a `BackendError` after `idle_timeout_s`)."""

    def __init__(self, *, idle_timeout_s: float) -> None:
        self.idle_timeout_s = idle_timeout_s
        self.requests: dict[str, asyncio.Queue[ChatRequest]] = {}
        self.turns: dict[str, asyncio.Queue[Turn]] = {}

    def open(self, session_id: str) -> None:
        self.requests[session_id], self.turns[session_id] = asyncio.Queue(), asyncio.Queue()

    def close(self, session_id: str) -> None:
        self.requests.pop(session_id, None)
        self.turns.pop(session_id, None)

    async def chat(self, request: ChatRequest) -> Turn:
        turns = self.turns[request.session_id]
        await self.requests[request.session_id].put(request)
        try:
            return await asyncio.wait_for(turns.get(), self.idle_timeout_s)
        except TimeoutError:
            raise RequestTimeoutError(f"NeMo RL sent no next turn within {self.idle_timeout_s:g} s (the sample was dropped)") from None


@dataclass
class _Session:
    task: Task
    rollout: asyncio.Task[RolloutRecord]
    messages_seen: int = 0
    """How many of the rollout's chat messages NeMo RL already has (rendered in its token stream)."""


@dataclass
class _Totals:
    rollouts: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    masked: int = 0
    rewards: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    turns: int = 0


class GymBridgeEnvironment(_Interface):  # type: ignore[misc]  # nemo_rl's base class: Any to mypy (no stubs, not on PyPI)
    """A NeMo RL environment running gym_bridge environments; rows route by `agent_ref` as everywhere.

    NeMo RL's `run_multi_turn_rollout` passes each sample's log as `role`/`content` pairs (assistant
    text decoded without special tokens), tokenizes each observation's `content` as it is, and stops a
    sample when `terminateds` says so. So `step` feeds the last assistant message to the sample's
    rollout (`TurnFeed`), and returns as observation `ChatTemplate.delta_text` of the tool outputs and
    the next generation prompt (assuming the turn ended on the end-of-turn token), or, when the rollout
    ended, its reward with the failure kind and `mask_sample` in the metadata.

    `config` (NeMo RL's `env.<name>` block): `tokenizer` (the policy's tokenizer path, for the chat
    template), `max_turns` (8), `deadline_s` (3600: generation by NeMo RL counts), `idle_timeout_s`
    (900: a sample NeMo RL stops stepping, e.g. truncated at `max_seq_len`, is ended then),
    `tool_format` (`native` or `hermes_system`; default: by the template), `max_concurrency` (4096).
    """

    def __init__(self, config: Mapping[str, Any] | None = None, *, tokenizer: Any = None) -> None:
        config = dict(config or {})
        if tokenizer is None:
            from gym_bridge.policies.tokenizer import load_tokenizer

            if not config.get("tokenizer"):
                raise ConfigError("GymBridgeEnvironment needs config['tokenizer']: the policy's tokenizer path")
            tokenizer = load_tokenizer(str(config["tokenizer"])).tokenizer
        self.template = ChatTemplate(tokenizer, tool_format=config.get("tool_format"))
        check_append_only(self.template)
        self.feed = TurnFeed(idle_timeout_s=float(config.get("idle_timeout_s", 900.0)))
        self.engine = Engine(self.feed, None, EngineConfig(
            limits=Limits(max_turns=int(config.get("max_turns", 8)), max_completion_tokens=1 << 40),
            deadline_s=float(config.get("deadline_s", 3600.0)), max_concurrency=int(config.get("max_concurrency", 4096)),
        ))
        self.eos_token_id = tokenizer.eos_token_id
        self.sessions: dict[str, _Session] = {}
        self._counter = itertools.count()
        self._totals = _Totals()

    # -- EnvironmentInterface ------------------------------------------------------------------

    def step(self, message_log_batch: Sequence[Sequence[Mapping[str, Any]]], metadata: Sequence[Any]) -> EnvironmentReturn:
        """Feed each sample's last assistant turn to its rollout; return what the rollouts do next."""
        import torch

        results = _LOOP.run(self._step_all(message_log_batch, metadata))
        return EnvironmentReturn(
            observations=[result[0] for result in results],
            metadata=[result[1] for result in results],
            next_stop_strings=[None] * len(results),
            rewards=torch.tensor([result[2] for result in results], dtype=torch.float32),
            terminateds=torch.tensor([result[3] for result in results], dtype=torch.bool),
            answers=[result[4] for result in results],
        )

    def global_post_process_and_metrics(self, batch: Any) -> tuple[Any, dict[str, float]]:
        """The batch unchanged, and metrics of the rollouts that ended since the last call:
        `gym_bridge/failed` and `gym_bridge/failed/<kind>` (fractions), `gym_bridge/masked`,
        `gym_bridge/<env>/reward` (mean), `gym_bridge/num_turns` (mean model calls)."""
        totals, self._totals = self._totals, _Totals()
        if not totals.rollouts:
            return batch, {}
        metrics = {"gym_bridge/failed": sum(totals.failures.values()) / totals.rollouts, "gym_bridge/masked": totals.masked / totals.rollouts}
        for kind in FAILURE_KINDS:
            metrics[f"gym_bridge/failed/{kind}"] = totals.failures[kind] / totals.rollouts
        for env, rewards in sorted(totals.rewards.items()):
            metrics[f"gym_bridge/{env}/reward"] = sum(rewards) / len(rewards)
        metrics["gym_bridge/num_turns"] = totals.turns / totals.rollouts
        return batch, metrics

    def shutdown(self) -> None:
        """Cancel the rollouts still waiting for a turn."""
        sessions, self.sessions = self.sessions, {}
        for session in sessions.values():
            _LOOP.submit(_cancel(session.rollout))

    # -- the steps -----------------------------------------------------------------------------

    async def _step_all(self, logs: Sequence[Sequence[Mapping[str, Any]]], metadata: Sequence[Any]) -> list[tuple[Any, ...]]:
        if len(logs) != len(metadata):
            raise ValueError(f"got {len(logs)} message logs but {len(metadata)} metadata entries")
        return list(await asyncio.gather(*(self._step_one(log, meta) for log, meta in zip(logs, metadata))))

    async def _step_one(self, log: Sequence[Mapping[str, Any]], meta: Any) -> tuple[Any, ...]:
        meta = dict(meta or {})
        session_id = meta.get(SESSION_KEY)
        session = self.sessions.get(session_id) if session_id else None
        if session is None:
            session_id, session = await self._start(meta)
            meta[SESSION_KEY] = session_id
            if session.rollout.done():  # failed before its first model call (setup)
                return self._finish(session_id, meta)
        if not log or log[-1].get("role") != "assistant":
            raise ValueError(f"the message log of session {session_id} does not end with an assistant message")
        await self.feed.turns[session_id].put(Turn(text=str(log[-1].get("content") or "")))
        request = await self._next_request(session_id, session)
        if request is None:
            return self._finish(session_id, meta)
        new_messages = list(request.messages[session.messages_seen:])
        session.messages_seen = len(request.messages)
        observation = self.template.delta_text([m for m in new_messages if m["role"] != "assistant"],
                                                  closing_sampled=self.template.closing_text(self.eos_token_id))
        return {"role": "tool", "content": observation}, meta, 0.0, False, None

    async def _start(self, meta: dict[str, Any]) -> tuple[str, _Session]:
        row = meta.get(ROW_KEY)
        if row is None:
            raise DataError(f"metadata has no {ROW_KEY!r}: build the data with gym_bridge.nemo_rl.datum_from_row")
        index = next(self._counter)
        task = parse_task(dict(row), index=index, source=f"nemo_rl sample {meta.get('idx', index)}")
        env_class: type[Environment] = resolve_tasks([task])[task.env_name]
        ensure_ready([env_class])
        session_id = f"{index}-0"
        self.feed.open(session_id)
        rollout = asyncio.ensure_future(self.engine.rollout(task, 0, env_class=env_class))
        session = self.sessions[session_id] = _Session(task=task, rollout=rollout)
        first = await self._next_request(session_id, session)
        if first is not None:
            session.messages_seen = len(first.messages)
        return session_id, session

    async def _next_request(self, session_id: str, session: _Session) -> ChatRequest | None:
        """The rollout's next request for a turn, or None when it ended instead."""
        asked = asyncio.ensure_future(self.feed.requests[session_id].get())
        await asyncio.wait({asked, session.rollout}, return_when=asyncio.FIRST_COMPLETED)
        if asked.done():
            return asked.result()
        asked.cancel()
        return None

    def _finish(self, session_id: str, meta: dict[str, Any]) -> tuple[Any, ...]:
        session = self.sessions.pop(session_id)
        self.feed.close(session_id)
        record = session.rollout.result()
        totals = self._totals
        totals.rollouts += 1
        totals.turns += record.turns
        if record.failure_kind:
            totals.failures[record.failure_kind] += 1
        if record.mask_sample:
            totals.masked += 1
        else:
            totals.rewards[record.env].append(record.reward)
        meta.update(gym_bridge_reward=record.reward, reward_components=dict(record.reward_components), mask_sample=record.mask_sample,
                    failure_kind=record.failure_kind, failure_reason=record.failure_reason, finish_reason=record.finish_reason)
        reward = 0.0 if record.mask_sample else float(record.reward)
        return {"role": "environment", "content": ""}, meta, reward, True, final_text(record.output)


async def _cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()


def datum_from_row(datum_dict: Mapping[str, Any], task_data_spec: Any, tokenizer: Any, max_seq_length: int | None, idx: int,
                   *, tool_format: ToolFormat | None = None) -> dict[str, Any]:
    """A NeMo RL data processor (`TaskDataProcessFnCallable`): a gym_bridge row (its fields, a
    `gym_bridge_row` JSON column, or the JSON line in `extra_env_info` that NeMo RL's `NemoGymDataset`
    loads) as a `DatumSpec` whose one message is the prompt rendered by the chat
    template with the environment's tools, and whose `extra_env_info` carries the row for `step`.
    Raises DataError / UnknownEnvironmentError for a bad row. A prompt longer than `max_seq_length`
    is cut and gets `loss_multiplier` 0, as NeMo RL's own processors do."""
    import torch

    raw = datum_dict.get("extra_env_info")
    row = json.loads(raw) if isinstance(raw, str) else row_from_columns(datum_dict)
    task = parse_task(row, index=idx, source=f"row {idx}")
    env_class = resolve_tasks([task])[task.env_name]
    tools = task.tools if task.tools is not None else tuple(spec.schema for spec in env_class.tool_specs().values())
    template = ChatTemplate(tokenizer, tool_format=tool_format)
    text = template.prompt_text(task_template_messages(task.messages), tools or None)
    token_ids = torch.tensor(template.encode(text), dtype=torch.int64)
    loss_multiplier = 1.0
    if max_seq_length is not None and len(token_ids) >= max_seq_length:
        token_ids, loss_multiplier = token_ids[: min(4, max_seq_length)], 0.0
    return {
        "message_log": [{"role": "user", "content": text, "token_ids": token_ids}],
        "length": len(token_ids),
        "extra_env_info": {ROW_KEY: row},
        "loss_multiplier": loss_multiplier,
        "idx": idx,
        "task_name": datum_dict.get("task_name") or ENV_NAME,
    }


def register(env_name: str = ENV_NAME, processor_name: str = "gym_bridge_processor") -> None:
    """Register the environment and the data processor with NeMo RL (`register_env`, `register_processor`,
    and the actor's Python environment: the system one, where gym_bridge is installed); call it in the
    launch script before `setup_response_data`. Needs NeMo RL installed."""
    from nemo_rl.data.processors import register_processor
    from nemo_rl.distributed.ray_actor_environment_registry import ACTOR_ENVIRONMENT_REGISTRY
    from nemo_rl.distributed.virtual_cluster import PY_EXECUTABLES
    from nemo_rl.environments.utils import register_env

    actor = f"{__name__}.GymBridgeEnvironmentActor"
    ACTOR_ENVIRONMENT_REGISTRY.setdefault(actor, PY_EXECUTABLES.SYSTEM)
    register_env(env_name, actor)
    register_processor(processor_name, datum_from_row)


def __getattr__(name: str) -> Any:
    if name == "GymBridgeEnvironmentActor":  # what NeMo RL's create_env starts: a Ray actor class
        import ray

        actor = globals()[name] = ray.remote(GymBridgeEnvironment)
        return actor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

