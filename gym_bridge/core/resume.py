"""Resuming one rollout from the journal: its loop runs again from turn 0 with committed model calls answered from the journal.

Each replayed call's prompt must equal the journal's, token for token, so transcript, budgets and record come out as an
uninterrupted run's. The environment comes back as it declares (`Environment.resume`): `snapshot` restores the saved
state and takes committed tool outputs from the journal; `replay` reruns the logged calls in a fresh session, checking
each output (a difference restarts from turn 0, saying why); `restart` journals nothing. Turn k commits before call k+1;
`snapshot()` runs there off the event loop under the tool timeout, and a state equal to the last one committed is not
written again. Resume enters a rollout only as wrappers (`RolloutResume` is its `RolloutSeams`): around the policy and
around the environment session (`JournaledSession`); the engine and the loop do not know.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, NoReturn, Sequence, TypeVar

import orjson

from gym_bridge.core.environment import Environment, VerifyResult
from gym_bridge.core.errors import FailRollout, RolloutError
from gym_bridge.core.items import Item
from gym_bridge.core.journal import ResumeKind, RolloutKey, RunJournal
from gym_bridge.core.journal_event import ChatEvent, JournalEvent, ModelEvent, ToolEvent, UserEvent
from gym_bridge.core.session import PLAIN, EnvironmentSession, RolloutSeams, Session
from gym_bridge.core.task import Task
from gym_bridge.core.policy import ChatPolicy, ChatRequest, Generation, GenerationRequest, Policy, by_policy_kind
from gym_bridge.core.record import RolloutRecord
from gym_bridge.core.trajectory import Trajectory
from gym_bridge.core.turn import CallTokens, ToolCall, Turn

EventT = TypeVar("EventT", ModelEvent, ChatEvent, ToolEvent, UserEvent)

_SNAPSHOT_JSON = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY
"""What a journal frame accepts (`encode_frame`), keys sorted so an unchanged state encodes the same."""


class ReplayMismatch(RolloutError):
    """Replaying a rollout's committed turns gave something other than the journal holds; the engine restarts it from turn 0."""

    failure_kind = "env"


@dataclass
class RolloutResume:
    """One attempt of one journaled rollout: what to replay, and the turns to commit. It is the attempt's
    `RolloutSeams`: the engine runs the attempt with the policy and session it wraps."""

    journal: RunJournal
    key: RolloutKey
    kind: ResumeKind
    attempt: int
    snapshot_version: int
    replay: list[JournalEvent] = field(default_factory=list)
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
    _pending: list[JournalEvent] = field(default_factory=list)
    _prompt_end: int = 0
    _started: float = 0.0
    _session: EnvironmentSession | None = None
    _trajectory: Trajectory | None = None
    _snapshot_json: bytes | None = None
    """The last snapshot committed, encoded (an unchanged state is not journaled again)."""

    @property
    def resumed_from_turn(self) -> int:
        return sum(1 for event in self.replay if isinstance(event, (ModelEvent, ChatEvent)))

    @property
    def restores(self) -> bool:
        """Whether the environment comes back through its `restore` hook instead of `setup`."""
        return self.kind == "snapshot" and bool(self.replay)

    def wrap_session(self, session: EnvironmentSession, trajectory: Trajectory) -> Session:
        """`session` with committed tool calls replayed and new ones journaled; starts this attempt's clock. Commits
        read `trajectory` (budgets) and `session` (snapshots)."""
        self._session, self._trajectory, self._started = session, trajectory, time.perf_counter()
        self._committed = len(self.replay)
        return JournaledSession(self, session)

    async def setup(self, task: Task, session: EnvironmentSession) -> None:
        """The session's `setup`, or its `restore` from the journal's snapshot; a restore that fails restarts the
        rollout from turn 0, saying why."""
        if not self.restores:
            await session.setup(task)
            return
        try:
            await session.restore(task, self.snapshot)
        except RolloutError as error:
            self._diverge(f"restore() failed: {error}")

    def wrap_policy(self, policy: Policy | ChatPolicy) -> Policy | ChatPolicy:
        """`policy` with committed calls answered from the journal and live ones journaled."""
        return by_policy_kind(policy, token=lambda token: _ReplayingPolicy(self, token),
                              chat=lambda chat: _ReplayingChatPolicy(self, chat))

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

    # -- what the wrappers call (`_ReplayingPolicy`, `_ReplayingChatPolicy`, `JournaledSession`) ----------

    async def generate(self, request: GenerationRequest, policy: Policy) -> Generation:
        event = self._replayed(ModelEvent)
        prompt = request.prompt_ids
        if event is not None:
            if len(prompt) != event.prompt_length or list(prompt[self._prompt_end:]) != event.prompt_delta:
                self._diverge(f"the prompt of model call {self._turn()} differs from the journal's")
            self._prompt_end = len(prompt) + len(event.token_ids)
            return _generation(event)
        if self._pending:
            await self._commit()
        generation = await policy.generate(request)
        self._pending.append(_model_event(generation, prompt_delta=list(prompt[self._prompt_end:]), prompt_length=len(prompt)))
        self._prompt_end = len(prompt) + len(generation.token_ids)
        return generation

    async def chat(self, request: ChatRequest, policy: ChatPolicy) -> Turn:
        event = self._replayed(ChatEvent)
        digest = hashlib.blake2b(orjson.dumps(list(request.messages), option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS),
                                 digest_size=16).hexdigest()
        if event is not None:
            if event.message_count != len(request.messages) or event.digest != digest:
                self._diverge(f"the messages of model call {self._turn()} differ from the journal's")
            return _chat_turn(event)
        if self._pending:
            await self._commit()
        turn = await policy.chat(request)
        self._pending.append(_chat_event(turn, message_count=len(request.messages), digest=digest))
        return turn

    async def call_tool(self, call: ToolCall, session: EnvironmentSession) -> str:
        """The output of a tool call: the journal's for a committed call of a `snapshot` environment; else the call
        run in `session` (for a committed call of a `replay` environment, checked against the journal's output)."""
        event = self._replayed(ToolEvent)
        if event is None:
            content = await session.call_tool(call)
            self._pending.append(ToolEvent(name=call.name, arguments=call.arguments, output=content))
            return content
        if event.name != call.name or event.arguments != call.arguments:
            self._diverge(f"tool call {call.name!r} of turn {self._turn()} is not the journal's {event.name!r} call")
        if self.kind == "snapshot":
            return event.output
        content = await session.call_tool(call)
        if content != event.output:
            self._diverge(f"replayed tool call {call.name!r} of turn {self._turn()} returned another output than the journal's")
        return content

    def user_message(self, content: str) -> None:
        """A user message the loop appends (simulated users): journaled, or checked against the journal's."""
        event = self._replayed(UserEvent)
        if event is None:
            self._pending.append(UserEvent(text=content))
        elif event.text != content:
            self._diverge(f"the user message after turn {self._turn()} differs from the journal's")

    # -- internals ---------------------------------------------------------------------------------------

    def _turn(self) -> int:
        return sum(1 for event in self.replay[:self._cursor] if isinstance(event, (ModelEvent, ChatEvent)))

    def _replayed(self, kind: type[EventT]) -> EventT | None:
        """The next committed event, which must be a `kind`; None once every committed event was replayed."""
        if self._cursor >= len(self.replay):
            return None
        event = self.replay[self._cursor]
        if not isinstance(event, kind):
            self._diverge(f"the loop asked for a {kind.kind} event at turn {self._turn()} where the journal has a "
                          f"{event.kind} event")
        self._cursor += 1
        return event

    def _diverge(self, reason: str) -> NoReturn:
        self.diverged = reason
        raise ReplayMismatch(reason)

    async def _commit(self) -> None:
        """The turn boundary: the events since the last commit, the budgets and the snapshot, written; done once they
        are durable. Raises FailRollout(`env`) naming `snapshot()` when it raises, hangs past the tool timeout,
        returns what is not JSON data, or more than the environment's `max_snapshot_bytes`."""
        trajectory = self._trajectory
        assert trajectory is not None, "wrap_session() comes first"
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
        session = self._session
        assert session is not None, "wrap_session() comes first"
        env_class = session.env_class
        state = await session.snapshot()
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
                         attempt: Callable[[RolloutSeams], Awaitable[RolloutRecord]]) -> RolloutRecord:
    """Run rollout `key` through `attempt` (the engine's, wrapped by the resume plan the journal gives, or by nothing for
    an environment that restarts); a replay that diverges is run again from turn 0. The record says when the rollout
    was resumed (`metrics.attempts`, ...)."""
    plan = prepare(journal, key, env_class)
    if plan is None:
        return await attempt(PLAIN)
    record = await attempt(plan)
    if plan.diverged is not None:
        plan = plan.restarted()
        record = await attempt(plan)
    if plan.attempt <= 1:
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

    async def generate(self, request: GenerationRequest) -> Generation:
        return await self.resume.generate(request, self.policy)

    async def aclose(self) -> None:
        """The wrapped policy stays with its owner."""


class _ReplayingChatPolicy:
    """A chat policy whose committed calls come from the journal (see `RolloutResume.chat`)."""

    def __init__(self, resume: RolloutResume, policy: ChatPolicy) -> None:
        self.resume, self.policy = resume, policy

    async def chat(self, request: ChatRequest) -> Turn:
        return await self.resume.chat(request, self.policy)


class JournaledSession:
    """An environment session whose tool calls and user messages go through the journal (see `RolloutResume.call_tool`),
    and whose setup may be a restore from the journal's snapshot; verify and close are the session's own."""

    def __init__(self, resume: RolloutResume, session: EnvironmentSession) -> None:
        self.resume, self.session = resume, session

    @property
    def env(self) -> Environment:
        return self.session.env

    async def setup(self, task: Task) -> None:
        await self.resume.setup(task, self.session)

    async def call_tool(self, call: ToolCall) -> str:
        return await self.resume.call_tool(call, self.session)

    def offer(self, tools: Sequence[dict[str, Any]]) -> None:
        self.session.offer(tools)

    def user_message(self, content: str) -> None:
        self.resume.user_message(content)

    async def verify(self, task: Task, output: list[Item]) -> VerifyResult:
        return await self.session.verify(task, output)

    async def close(self) -> FailRollout | None:
        return await self.session.close()


def _model_event(generation: Generation, *, prompt_delta: list[int], prompt_length: int) -> ModelEvent:
    return ModelEvent(prompt_delta=prompt_delta, prompt_length=prompt_length, token_ids=generation.token_ids,
                      logprobs=generation.logprobs, finish_reason=generation.finish_reason, text=generation.text,
                      metrics=generation.metrics, policy_version=generation.policy_version)


def _generation(event: ModelEvent) -> Generation:
    return Generation(token_ids=list(event.token_ids), logprobs=list(event.logprobs), finish_reason=event.finish_reason,
                      text=event.text, metrics=dict(event.metrics), policy_version=event.policy_version)


def _chat_event(turn: Turn, *, message_count: int, digest: str) -> ChatEvent:
    tokens = turn.tokens
    return ChatEvent(message_count=message_count, digest=digest, text=turn.text, reasoning=turn.reasoning,
                     calls=[[call.name, call.arguments] for call in turn.calls], finish_reason=turn.finish_reason,
                     usage=dict(turn.usage),
                     tokens=None if tokens is None else [list(tokens.prompt_token_ids), list(tokens.generation_token_ids),
                                                         list(tokens.generation_log_probs)])


def _chat_turn(event: ChatEvent) -> Turn:
    tokens = event.tokens
    return Turn(text=event.text, reasoning=event.reasoning,
                calls=tuple(ToolCall(name=name, arguments=arguments) for name, arguments in event.calls),
                finish_reason=event.finish_reason, usage=dict(event.usage),
                tokens=None if tokens is None else CallTokens(list(tokens[0]), list(tokens[1]), list(tokens[2])))
