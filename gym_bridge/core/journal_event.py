"""The events a journal commits for one rollout, typed: a model call (tokens or chat), a tool call, a user message.

Each is a frozen dataclass with `to_frame` (the dict a journal frame holds, key for key as format 2 writes it) and
`from_frame` (its inverse; `event_from_frame` picks the class by the frame's `t`). The short keys (`lp`, `fr`, `pv`,
`m`) are the on-disk names and live only here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

from gym_bridge.core.conversation import FinishReason


@dataclass(frozen=True)
class ModelEvent:
    """One call of a token policy: what its prompt added since the last call, and what it generated (`kind`: the
    frame's `t`, as on each event class)."""

    kind: ClassVar[str] = "model"
    prompt_delta: list[int]
    """The prompt's tokens after the end of the previous call's generation."""
    prompt_length: int
    """The prompt's length in tokens."""
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    text: str | None = None
    metrics: Mapping[str, Any] = field(default_factory=dict)
    policy_version: int | None = None

    def to_frame(self) -> dict[str, Any]:
        frame: dict[str, Any] = {"t": "model", "delta": self.prompt_delta, "n": self.prompt_length, "ids": self.token_ids,
                                 "lp": self.logprobs, "fr": self.finish_reason}
        if self.text is not None:
            frame["text"] = self.text
        if self.metrics:
            frame["m"] = self.metrics
        if self.policy_version is not None:
            frame["pv"] = self.policy_version
        return frame

    @classmethod
    def from_frame(cls, frame: Mapping[str, Any]) -> ModelEvent:
        return cls(prompt_delta=list(frame["delta"]), prompt_length=int(frame["n"]), token_ids=list(frame["ids"]),
                   logprobs=list(frame["lp"]), finish_reason=frame["fr"], text=frame.get("text"),
                   metrics=dict(frame.get("m") or {}), policy_version=frame.get("pv"))


@dataclass(frozen=True)
class ChatEvent:
    """One call of a chat policy: a digest of the messages it was sent, and its answer."""

    kind: ClassVar[str] = "chat"
    message_count: int
    digest: str
    """BLAKE2b (16 bytes, hex) of the messages as sorted-key JSON."""
    text: str
    reasoning: str
    calls: list[list[str]]
    """`[name, arguments]` of each tool call."""
    finish_reason: FinishReason
    usage: Mapping[str, Any]
    tokens: list[list[Any]] | None = None
    """`[prompt ids, generated ids, log-probs]` where the server gave them."""

    def to_frame(self) -> dict[str, Any]:
        return {"t": "chat", "n": self.message_count, "digest": self.digest, "text": self.text, "reasoning": self.reasoning,
                "calls": self.calls, "fr": self.finish_reason, "usage": self.usage, "tokens": self.tokens}

    @classmethod
    def from_frame(cls, frame: Mapping[str, Any]) -> ChatEvent:
        tokens = frame.get("tokens")
        return cls(message_count=int(frame["n"]), digest=str(frame["digest"]), text=frame["text"], reasoning=frame["reasoning"],
                   calls=[list(call) for call in frame["calls"]], finish_reason=frame["fr"], usage=dict(frame["usage"]),
                   tokens=None if tokens is None else [list(part) for part in tokens])


@dataclass(frozen=True)
class ToolEvent:
    """One tool call and the output the model read."""

    kind: ClassVar[str] = "tool"
    name: str
    arguments: str
    output: str

    def to_frame(self) -> dict[str, Any]:
        return {"t": "tool", "name": self.name, "args": self.arguments, "out": self.output}

    @classmethod
    def from_frame(cls, frame: Mapping[str, Any]) -> ToolEvent:
        return cls(name=frame["name"], arguments=frame["args"], output=str(frame["out"]))


@dataclass(frozen=True)
class UserEvent:
    """A user message the loop appended (simulated users, game observations)."""

    kind: ClassVar[str] = "user"
    text: str

    def to_frame(self) -> dict[str, Any]:
        return {"t": "user", "text": self.text}

    @classmethod
    def from_frame(cls, frame: Mapping[str, Any]) -> UserEvent:
        return cls(text=frame["text"])


JournalEvent = ModelEvent | ChatEvent | ToolEvent | UserEvent
_KINDS: dict[str, type[ModelEvent] | type[ChatEvent] | type[ToolEvent] | type[UserEvent]] = {
    event_class.kind: event_class for event_class in (ModelEvent, ChatEvent, ToolEvent, UserEvent)}


def event_from_frame(frame: Mapping[str, Any]) -> JournalEvent:
    """The event a frame's dict holds. Raises ValueError for an unknown kind, KeyError for a missing field."""
    event_class = _KINDS.get(str(frame.get("t")))
    if event_class is None:
        raise ValueError(f"unknown journal event kind {frame.get('t')!r}")
    return event_class.from_frame(frame)
