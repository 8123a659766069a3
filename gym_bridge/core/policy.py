"""The policy protocol: token ids in, sampled token ids and their log-probs out.

Every generation backend (scripted, transformers, vLLM engine, remote HTTP server) implements
`Policy.generate`. The engine owns templating and the token stream; a policy only continues a
prompt given as token ids, so what the trainer learns from is exactly what was sampled.
Backend errors are raised as `BackendError` (transport, server) or `ContextOverflowError`
(prompt does not fit); the engine turns them into failure records.

Hosted chat APIs cannot give token ids: they implement `ChatPolicy.chat` (messages in, a turn
out) and are for evaluation only; training code calls `require_token_policy` to refuse them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Protocol, Sequence, TypeGuard, TypeVar, runtime_checkable

from gym_bridge.core.conversation import FinishReason, Message
from gym_bridge.core.errors import BackendAnswerError, TokenPolicyRequiredError
from gym_bridge.core.turn import Turn

LogprobsMode = Literal["raw", "processed"]
"""`raw`: log-softmax of the model's logits. `processed`: log-softmax of the logits divided by the
temperature, which is what TRL's trainer recomputes for its importance-sampling correction
(like vLLM's `processed_logprobs`; top-p/top-k masks are not applied)."""


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings; the same values mean the same thing on every backend."""

    temperature: float = 1.0
    """0 means greedy decoding."""
    top_p: float = 1.0
    top_k: int = 0
    """0 disables top-k filtering."""
    max_new_tokens: int = 512
    stop: tuple[str, ...] = ()
    """Stop strings; the generation ends after the first one and includes it."""
    seed: int | None = None
    logprobs_mode: LogprobsMode = "raw"
    """Which log-probs to return with the sampled ids (see `LogprobsMode`)."""


@dataclass(frozen=True)
class GenerationRequest:
    """One continuation of a prompt given as token ids."""

    prompt_ids: Sequence[int]
    sampling: SamplingParams
    session_id: str = ""
    """All calls of one rollout share it, so a balancer can keep them on one server."""


@dataclass(frozen=True)
class Generation:
    """What a policy sampled: ids, one log-prob per id, and why it stopped."""

    token_ids: list[int]
    logprobs: list[float]
    """Log-probability of each sampled id, as `SamplingParams.logprobs_mode` asks."""
    finish_reason: FinishReason
    """`stop`: EOS or a stop string ended it; `length`: `max_new_tokens` was reached."""
    text: str | None = None
    """Decoded text, when the backend returns it (saves a decode)."""
    metrics: dict[str, float] = field(default_factory=dict)
    policy_version: int | None = None
    """The version of the weights this call's oldest token was sampled under (an async trainer bumps it at
    each weight sync); None when the backend does not know."""


@runtime_checkable
class Policy(Protocol):
    """A token-in/token-out generator. Implementations batch concurrent calls as they see fit."""

    async def generate(self, request: GenerationRequest) -> Generation:
        """Continue `request.prompt_ids`; raises `BackendError` or `ContextOverflowError`."""
        ...

    async def aclose(self) -> None:
        """Release what the policy holds (batching workers, connections); an engine or model it was
        handed stays with its owner. Called once, on the loop that used it, when the caller is done."""
        ...


@dataclass(frozen=True)
class ChatRequest:
    """One model turn of a conversation kept as messages (chat policies only)."""

    messages: Sequence[Message]
    """The conversation so far in chat-completions shape: `system`/`user` messages, `assistant`
    messages with `tool_calls` (`{id, type: "function", function: {name, arguments}}`), and
    `tool` messages with `tool_call_id`."""
    tools: Sequence[dict[str, Any]]
    """Function schemas in Responses shape (`{type: "function", name, description, parameters}`)."""
    sampling: SamplingParams
    session_id: str = ""


@runtime_checkable
class ChatPolicy(Protocol):
    """A message-based policy (hosted chat APIs): usable for evaluation, never for training."""

    async def chat(self, request: ChatRequest) -> Turn:
        """Answer one turn; raises `BackendError` or `ContextOverflowError`."""
        ...


def is_token_policy(policy: object) -> TypeGuard[Policy]:
    """Whether `policy` is token-in/token-out (has `generate`); chat policies are not."""
    return callable(getattr(policy, "generate", None))


_FromToken = TypeVar("_FromToken")
_FromChat = TypeVar("_FromChat")


def by_policy_kind(policy: object, *, token: Callable[[Policy], _FromToken],
                   chat: Callable[[ChatPolicy], _FromChat]) -> _FromToken | _FromChat:
    """`token(policy)` for a token-in/token-out policy (it has `generate`), else `chat(policy)` for a chat policy (it
    has `chat`): the one place a policy's kind is told apart. Raises TypeError for an object that is neither."""
    if is_token_policy(policy):
        return token(policy)
    if isinstance(policy, ChatPolicy):
        return chat(policy)
    raise TypeError(f"{type(policy).__name__} is not a policy: it has neither generate() nor chat()")


def require_token_policy(policy: object) -> Policy:
    """Return `policy` if it is token-in/token-out; trainer adapters call this before training.

    Raises `TokenPolicyRequiredError` naming the policies that can train instead.
    """
    if is_token_policy(policy):
        return policy
    raise TokenPolicyRequiredError(
        f"{type(policy).__name__} talks to a chat API that returns text, not the sampled token ids and "
        "their log-probs, so it cannot be used for training (it is for `gym-bridge eval` only). Train with "
        "a token-in/token-out policy instead: gym_bridge.policies.remote.RemotePolicy for an OpenAI-compatible "
        "server such as `vllm serve` or `trl vllm-serve` (it calls /v1/completions with token ids), "
        "gym_bridge.policies.vllm_engine.VLLMEnginePolicy for a vllm.LLM in this process, or "
        "gym_bridge.policies.transformers.TransformersPolicy for a Hugging Face model."
    )


_Step = TypeVar("_Step")


def next_scripted(script: Mapping[str, Sequence[_Step]], cursor: dict[str, int], session_id: str, *, owner: str,
                  unit: str) -> _Step:
    """The next step of `session_id` in a scripted policy's `script` (its own list, else the fallback key ""),
    its `cursor` advanced; a session with no script, or past its last step, raises BackendAnswerError."""
    key = session_id if session_id in script else ""
    if key not in script:
        raise BackendAnswerError(f"{owner} has no script for session {session_id!r}")
    position = cursor.get(session_id, 0)
    steps = script[key]
    if position >= len(steps):
        raise BackendAnswerError(f"{owner} ran out of {unit} for session {session_id!r}")
    cursor[session_id] = position + 1
    return steps[position]


@dataclass
class ScriptedPolicy:
    """A policy for tests: replays canned generations in order, per session or globally.

    `script` maps a session id to its list of generations; the key "" is the fallback used by
    every session without its own entry. Each call pops the next generation of its session;
    a `BaseException` instance in the script is raised instead, to exercise failure paths.
    """

    script: dict[str, list[Generation | BaseException]]
    calls: list[GenerationRequest] = field(default_factory=list)
    record_calls: bool = True
    _cursor: dict[str, int] = field(default_factory=dict)

    async def generate(self, request: GenerationRequest) -> Generation:
        step = next_scripted(self.script, self._cursor, request.session_id, owner="ScriptedPolicy", unit="steps")
        if self.record_calls:
            self.calls.append(request)
        if isinstance(step, BaseException):
            raise step
        return step

    async def aclose(self) -> None:
        """Nothing to release."""


@dataclass
class ScriptedChatPolicy:
    """A chat policy for tests, `ScriptedPolicy`'s counterpart: replays canned turns in order, per
    session or globally.

    `script` maps a session id to its list of turns (a `Turn`, or a `str` for a text-only answer);
    the key "" is the fallback used by every session without its own entry. Each call pops the next
    turn of its session; a `BaseException` instance in the script is raised instead. `requests` keeps
    every request, so a test can read the conversation each turn was sent.
    """

    script: dict[str, list[Turn | str | BaseException]]
    requests: list[ChatRequest] = field(default_factory=list)
    record_calls: bool = True
    _cursor: dict[str, int] = field(default_factory=dict)

    async def chat(self, request: ChatRequest) -> Turn:
        step = next_scripted(self.script, self._cursor, request.session_id, owner="ScriptedChatPolicy", unit="turns")
        if self.record_calls:
            self.requests.append(request)
        if isinstance(step, BaseException):
            raise step
        return Turn(text=step) if isinstance(step, str) else step

    async def aclose(self) -> None:
        """Nothing to release."""
