"""Resuming one rollout from the journal: its loop runs again from turn 0 with committed model calls answered from the journal.

Each replayed call's prompt must equal the journal's, token for token, so transcript, budgets and record come out as an
uninterrupted run's. The environment comes back as it declares (`Environment.resume`): `snapshot` restores the saved
state and takes committed tool outputs from the journal; `replay` reruns the logged calls in a fresh session, checking
each output (a difference restarts from turn 0, saying why); `restart` journals nothing. Turn k commits before call k+1;
`snapshot()` runs there off the event loop under the tool timeout, and a state equal to the last one committed is not
written again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Coroutine

import orjson

from gym_bridge.core.bounded.call import call_environment
from gym_bridge.core.environment import Environment
from gym_bridge.core.errors import FailRollout, RolloutError, classify
from gym_bridge.core.journal import ResumeKind, RolloutKey, RunJournal
from gym_bridge.core.policy import ChatPolicy, ChatRequest, Generation, GenerationRequest, Policy, is_token_policy
from gym_bridge.core.record import RolloutRecord
from gym_bridge.core.trajectory import Trajectory
from gym_bridge.core.turn import CallTokens, ToolCall, Turn

_GENERATION_FIELDS = frozenset(f.name for f in dataclasses.fields(Generation))
_SNAPSHOT_JSON = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY
"""What a journal frame accepts (`encode_frame`), keys sorted so an unchanged state encodes the same."""


class ReplayMismatch(RolloutError):
    """Replaying a rollout's committed turns gave something other than the journal holds; the engine restarts it from turn 0."""

    failure_kind = "env"


@dataclass
class RolloutResume:
    """One attempt of one journaled rollout: what to replay, and the turns to commit."""

    journal: RunJournal
    key: RolloutKey
    kind: ResumeKind
    attempt: int
    snapshot_version: int
    replay: list[dict[str, Any]] = field(default_factory=list)
    """Committed events to replay, in order ([] for a rollout that starts at turn 0)."""
    spent_s: float = 0.0
    """Seconds the earlier attempts used, charged to this one's deadline."""
    snapshot: Any = None
    restart_reason: str | None = None
    """Why an earlier attempt's turns were not used (a replay mismatch, a changed snapshot version)."""
    diverged: str | None = None
    """Set when this attempt's replay found a difference: the engine then starts the rollout again from turn 0."""
    _cursor: int = 0
    _committed: int = 0
    _pending: list[dict[str, Any]] = field(default_factory=list)
    _prompt_end: int = 0
    _started: float = 0.0
    _env: Environment | None = None
    _trajectory: Trajectory | None = None
    _snapshot_json: bytes | None = None
    """The last snapshot committed, encoded (an unchanged state is not journaled again)."""

    @property
    def resumed_from_turn(self) -> int:
        return sum(1 for event in self.replay if event["t"] in ("model", "chat"))

    @property
    def restores(self) -> bool:
        """Whether the environment comes back through its `restore` hook instead of `setup`."""
        return self.kind == "snapshot" and bool(self.replay)

    def begin(self, env: Environment, trajectory: Trajectory) -> None:
        """Start this attempt's clock; `env` and `trajectory` are what commits read."""
        self._env, self._trajectory, self._started = env, trajectory, time.perf_counter()
        self._committed = len(self.replay)

    async def restore(self, run: Callable[[], Awaitable[Any]]) -> None:
        """Run the environment's `restore` (`run`); one that fails restarts the rollout from turn 0, saying why."""
        try:
            await run()
        except RolloutError as error:
            self._diverge(f"restore() failed: {error}")

    def wrap(self, policy: Policy | ChatPolicy) -> Policy | ChatPolicy:
        """`policy` with committed calls answered from the journal and live ones journaled."""
        if is_token_policy(policy):
            return _ReplayingPolicy(self, policy)
        if not isinstance(policy, ChatPolicy):
            raise TypeError(f"{type(policy).__name__} is not a policy: it has neither generate() nor chat()")
        return _ReplayingChatPolicy(self, policy)

    def restarted(self) -> RolloutResume:
        """A fresh attempt from turn 0 after this one's replay diverged or its restore failed (the record says why)."""
        return RolloutResume(journal=self.journal, key=self.key, kind=self.kind, attempt=self.attempt,
                             snapshot_version=self.snapshot_version, restart_reason=self.diverged)

    def metrics(self) -> dict[str, Any]:
        """What a record says about its resumption ({} for a rollout that ran once)."""
        if self.attempt <= 1:
            return {}
        found: dict[str, Any] = {"attempts": self.attempt, "resumed_from_turn": self.resumed_from_turn}
        if self.restart_reason:
            found["resume_restarted"] = self.restart_reason
        return found

    # -- the interception points the engine, the transcript and the loop call ---------------------------

    async def generate(self, request: GenerationRequest, policy: Policy) -> Generation:
        event = self._replayed("model") if self._cursor < len(self.replay) else None
        prompt = request.prompt_ids
        if event is not None:
            delta = event["delta"]
            if len(prompt) != event["n"] or list(prompt[self._prompt_end:]) != delta:
                self._diverge(f"the prompt of model call {self._turn()} differs from the journal's")
            self._prompt_end = len(prompt) + len(event["ids"])
            return _generation(event)
        if self._pending:
            await self._commit()
        generation = await policy.generate(request)
        ids = generation.token_ids
        event = {"t": "model", "delta": prompt[self._prompt_end:], "n": len(prompt), "ids": ids, "lp": generation.logprobs,
                 "fr": generation.finish_reason}
        if generation.text is not None:
            event["text"] = generation.text
        if generation.metrics:
            event["m"] = generation.metrics
        version = getattr(generation, "policy_version", None)
        if version is not None:
            event["pv"] = version
        self._pending.append(event)
        self._prompt_end = len(prompt) + len(ids)
        return generation

    async def chat(self, request: ChatRequest, policy: ChatPolicy) -> Turn:
        event = self._replayed("chat") if self._cursor < len(self.replay) else None
        digest = hashlib.blake2b(orjson.dumps(list(request.messages), option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS),
                                 digest_size=16).hexdigest()
        if event is not None:
            if event["n"] != len(request.messages) or event["digest"] != digest:
                self._diverge(f"the messages of model call {self._turn()} differ from the journal's")
            return _chat_turn(event)
        if self._pending:
            await self._commit()
        turn = await policy.chat(request)
        self._pending.append({"t": "chat", "n": len(request.messages), "digest": digest, **_chat_event(turn)})
        return turn

    async def tool_output(self, call: ToolCall, run: Callable[[ToolCall], Awaitable[str]]) -> str:
        """The output of a tool call: the journal's for a committed call of a `snapshot` environment; else the call
        run (for a committed call of a `replay` environment, checked against the journal's output)."""
        event = self._replayed("tool") if self._cursor < len(self.replay) else None
        if event is None:
            content = await run(call)
            self._pending.append({"t": "tool", "name": call.name, "args": call.arguments, "out": content})
            return content
        if event["name"] != call.name or event["args"] != call.arguments:
            self._diverge(f"tool call {call.name!r} of turn {self._turn()} is not the journal's {event['name']!r} call")
        if self.kind == "snapshot":
            return str(event["out"])
        content = await run(call)
        if content != event["out"]:
            self._diverge(f"replayed tool call {call.name!r} of turn {self._turn()} returned another output than the journal's")
        return content

    def user_message(self, content: str) -> None:
        """A user message the loop appends (simulated users): journaled, or checked against the journal's."""
        event = self._replayed("user") if self._cursor < len(self.replay) else None
        if event is None:
            self._pending.append({"t": "user", "text": content})
        elif event["text"] != content:
            self._diverge(f"the user message after turn {self._turn()} differs from the journal's")

    # -- internals ---------------------------------------------------------------------------------------

    def _turn(self) -> int:
        return sum(1 for event in self.replay[:self._cursor] if event["t"] in ("model", "chat"))

    def _replayed(self, kind: str) -> dict[str, Any] | None:
        event = self.replay[self._cursor]
        if event["t"] != kind:
            self._diverge(f"the loop asked for a {kind} event at turn {self._turn()} where the journal has a {event['t']} event")
        self._cursor += 1
        return event

    def _diverge(self, reason: str) -> None:
        self.diverged = reason
        raise ReplayMismatch(reason)

    async def _commit(self) -> None:
        """The turn boundary: the events since the last commit, the budgets and the snapshot, written; done once they
        are durable. Raises FailRollout(`env`) naming `snapshot()` when it raises, hangs past the tool timeout,
        returns what is not JSON data, or more than the environment's `max_snapshot_bytes`."""
        trajectory = self._trajectory
        assert trajectory is not None, "begin() comes first"
        snapshot = await self._snapshot() if self.kind == "snapshot" else None
        budgets = {"turns": trajectory.model_calls, "tokens": trajectory.tokens_spent,
                   "seconds": self.spent_s + time.perf_counter() - self._started}
        events, self._pending = self._pending, []
        durable = self.journal.commit(self.key, attempt=self.attempt, at=self._committed, events=events, budgets=budgets,
                                      kind=self.kind, snapshot=snapshot,
                                      snapshot_version=self.snapshot_version if self.kind == "snapshot" else None)
        self._committed += len(events)  # a commit that fails fails the attempt: nothing commits after it
        await durable

    async def _snapshot(self) -> Any:
        """The environment's state to commit (`snapshot()` in a worker thread, bounded like a tool call); None when it
        equals the last one committed."""
        env = self._env
        assert env is not None, "begin() comes first"
        env_class = type(env)
        try:
            state = await call_environment(env, "snapshot", timeout_s=env_class.tool_timeout_s)
        except Exception as error:
            raise classify(error, step="tool", what="snapshot()", timeout_s=env_class.tool_timeout_s) from None
        try:
            encoded = orjson.dumps(state, option=_SNAPSHOT_JSON)
        except TypeError as error:
            raise FailRollout("env", f"snapshot() returned {type(state).__name__}, which is not JSON data ({error}): "
                                     "return dicts, lists, strings and numbers") from None
        if len(encoded) > env_class.max_snapshot_bytes:
            raise FailRollout("env", f"snapshot() returned {len(encoded):,} bytes of JSON, above {env_class.__name__}."
                                     f"max_snapshot_bytes ({env_class.max_snapshot_bytes:,}): every changed state is "
                                     "journaled whole; keep the state smaller, raise the cap, or declare resume = 'replay'")
        if encoded == self._snapshot_json:
            return None
        self._snapshot_json = encoded
        return state


async def resume_rollout(journal: RunJournal, key: RolloutKey, env_class: type[Environment],
                         attempt: Callable[[RolloutResume | None], Awaitable[RolloutRecord]]) -> RolloutRecord:
    """Run rollout `key` through `attempt` (the engine's, with the resume plan the journal gives); a replay that
    diverges is run again from turn 0. The record says when the rollout was resumed (`metrics.attempts`, ...)."""
    plan = prepare(journal, key, env_class)
    record = await attempt(plan)
    if plan is not None and plan.diverged is not None:
        plan = plan.restarted()
        record = await attempt(plan)
    if plan is None or plan.attempt <= 1:
        return record
    return dataclasses.replace(record, resume=plan.metrics())


def prepare(journal: RunJournal, key: RolloutKey, env_class: type[Environment]) -> RolloutResume | None:
    """The resume plan of rollout `key`: None for an environment that restarts (nothing is journaled), else what the
    journal holds for it (committed turns to replay, budgets spent), or a fresh start with the reason the journal's
    turns cannot be used."""
    state = journal.restore(key)
    kind: ResumeKind = env_class.resume
    if kind == "restart":
        return None
    plan = RolloutResume(journal=journal, key=key, kind=kind, attempt=1, snapshot_version=env_class.snapshot_version)
    if state is None:
        return plan
    plan.attempt = state.attempt + 1
    if state.kind != kind:
        plan.restart_reason = f"the journal's turns were saved for resume kind {state.kind!r}, the environment now declares {kind!r}"
    elif kind == "snapshot" and state.snapshot_version != env_class.snapshot_version:
        plan.restart_reason = (f"the journal's snapshot has version {state.snapshot_version}, "
                               f"the environment's snapshot_version is {env_class.snapshot_version}")
    else:
        plan.replay, plan.snapshot = state.events, state.snapshot
        plan.spent_s = float(state.budgets.get("seconds", 0.0))
    return plan


class _ReplayingPolicy:
    """A token policy whose committed calls come from the journal (see `RolloutResume.generate`)."""

    def __init__(self, resume: RolloutResume, policy: Policy) -> None:
        self.resume, self.policy = resume, policy

    def generate(self, request: GenerationRequest) -> Coroutine[Any, Any, Generation]:
        return self.resume.generate(request, self.policy)  # the coroutine itself: one frame less on every call

    async def aclose(self) -> None:
        """The wrapped policy stays with its owner."""


class _ReplayingChatPolicy:
    """A chat policy whose committed calls come from the journal (see `RolloutResume.chat`)."""

    def __init__(self, resume: RolloutResume, policy: ChatPolicy) -> None:
        self.resume, self.policy = resume, policy

    async def chat(self, request: ChatRequest) -> Turn:
        return await self.resume.chat(request, self.policy)


def _generation(event: dict[str, Any]) -> Generation:
    values: dict[str, Any] = {"token_ids": list(event["ids"]), "logprobs": list(event["lp"]), "finish_reason": event["fr"],
                              "text": event.get("text"), "metrics": dict(event.get("m") or {})}
    if "policy_version" in _GENERATION_FIELDS:
        values["policy_version"] = event.get("pv")
    return Generation(**values)


def _chat_event(turn: Turn) -> dict[str, Any]:
    tokens = turn.tokens
    return {"text": turn.text, "reasoning": turn.reasoning, "calls": [[call.name, call.arguments] for call in turn.calls],
            "fr": turn.finish_reason, "usage": dict(turn.usage),
            "tokens": None if tokens is None else [list(tokens.prompt_token_ids), list(tokens.generation_token_ids),
                                                   list(tokens.generation_log_probs)]}


def _chat_turn(event: dict[str, Any]) -> Turn:
    tokens = event.get("tokens")
    return Turn(text=event["text"], reasoning=event["reasoning"],
                calls=tuple(ToolCall(name=name, arguments=arguments) for name, arguments in event["calls"]),
                finish_reason=event["fr"], usage=dict(event["usage"]),
                tokens=None if tokens is None else CallTokens(list(tokens[0]), list(tokens[1]), list(tokens[2])))
