"""What a capture session keeps and how it admits calls, whatever its policy kind: the calls answered,
their Responses items, the error answers, why it stopped, and the request checks both kinds share.

Budgets hold for concurrent calls too: a call counts against `max_turns` when it arrives and reserves
its token cap before it generates, and at most `max_parallel_calls` generations of one session run at
once (the others wait). Once a budget is spent every later call gets an error answer and `stop` says
why, so the harness can be ended.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar

import pydantic

from gym_bridge.capture.assembly import CapturedCall
from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.dialects.chat import ApiError, ChatBody, from_chat_tool
from gym_bridge.core.dialects.responses_api import ResponsesBody, check_stateless, to_chat_body, to_response
from gym_bridge.core.errors import BackendError, ContextOverflowError
from gym_bridge.core.items import Item
from gym_bridge.core.policy import SamplingParams
from gym_bridge.core.trajectory import final_text
from gym_bridge.core.transcript import ItemIds

_Body = TypeVar("_Body", bound=pydantic.BaseModel)
_Answer = TypeVar("_Answer")

StopKind = Literal["max_turns", "budget", "context_overflow", "infra"]
ChatCompletions = Callable[[Any], Awaitable[dict[str, Any]]]
"""A session's answer to one `/v1/chat/completions` body (what differs per policy kind)."""


@dataclass(frozen=True)
class SessionStop:
    """Why a session stopped serving: a budget spent (`max_turns`, `budget`), the context window
    overflowed (`context_overflow`) or the generation backend failed (`infra`)."""

    kind: StopKind
    reason: str


MAX_KEPT_ERRORS = 32
"""Error answers a session keeps for its record: the first half and the most recent half (the cause and the end of
a harness that retries a bad request thousands of times); the others are only counted (`errors_dropped`)."""
MAX_ERROR_MESSAGE_CHARS = 500
"""Characters kept of one error answer's message (one can quote what the request sent, a model name of megabytes)."""


@dataclass(frozen=True)
class EndpointError:
    """A call the session answered with an error status, as the harness saw it (its message cut to `MAX_ERROR_MESSAGE_CHARS`)."""

    status: int
    message: str


@dataclass(kw_only=True)
class SessionLedger:
    """One rollout's capture record and call admission: the calls, their items, the errors answered and why
    the session stopped; `turn`, `reserve` and `sampled` admit a call within the rollout's limits."""

    sampling: SamplingParams
    limits: Limits
    model_name: str
    label: str = ""
    """The rollout's session id (passed to the policy so a balancer keeps its calls together)."""
    token: str = field(default_factory=lambda: secrets.token_urlsafe(16))
    """The session's key: in the URL path and accepted as the API key."""
    calls: list[CapturedCall] = field(default_factory=list)
    output: list[Item] = field(default_factory=list)
    """Responses items of every call (tool outputs it was sent, reasoning, message, calls)."""
    errors: list[EndpointError] = field(default_factory=list)
    """The error answers kept (at most `MAX_KEPT_ERRORS`: the first and the latest)."""
    errors_dropped: int = 0
    """Error answers not kept (between the first and the latest)."""
    stop: SessionStop | None = None
    stopped: asyncio.Event = field(default_factory=asyncio.Event)
    last_finish_reason: str = ""
    """`stop` or `length` of the last call served."""
    token_in_calls: int = 0
    """Calls whose prompt extended the previous call's exact ids (the rest started a new conversation)."""
    max_parallel_calls: int = 1
    """Generations of this session at once; later calls wait their turn. One keeps the engine's
    concurrency bound (one generation per rollout) for harnesses that call the model in parallel."""
    numbering: ItemIds = field(init=False)
    """Numbers the items of every conversation's transcript (`<prefix>_<label>_<n>`)."""
    _in_flight: int = 0
    """Calls admitted (counted against `max_turns`) and not yet answered."""
    _reserved_tokens: int = 0
    """The token caps of the generations running now (counted against the budget until they end)."""
    _generations: set[asyncio.Task[Any]] = field(default_factory=set)
    _closed: bool = False
    _slots: asyncio.Semaphore = field(init=False)

    def __post_init__(self) -> None:
        if self.max_parallel_calls < 1:
            raise ValueError(f"max_parallel_calls must be at least 1, got {self.max_parallel_calls}")
        self._slots = asyncio.Semaphore(self.max_parallel_calls)
        self.numbering = ItemIds(self.label or "capture")

    @property
    def final_answer(self) -> str:
        """The text of the last assistant message the session answered ('' before any)."""
        return final_text(self.output)

    def answered(self, call: CapturedCall, finish_reason: str) -> None:
        """Record a call served (its ids and log-probs) and how its generation ended."""
        self.calls.append(call)
        self.last_finish_reason = finish_reason

    def fail(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None) -> ApiError:
        """Record an error answer and return it to raise."""
        self._log_error(status, message)
        return ApiError(status, message, kind, code=code)

    def _log_error(self, status: int, message: str) -> None:
        """Keep an error answer for the record, within `MAX_KEPT_ERRORS` and `MAX_ERROR_MESSAGE_CHARS`."""
        if len(message) > MAX_ERROR_MESSAGE_CHARS:
            message = f"{message[:MAX_ERROR_MESSAGE_CHARS]}... ({len(message) - MAX_ERROR_MESSAGE_CHARS} more characters)"
        self.errors.append(EndpointError(status=status, message=message))
        if len(self.errors) > MAX_KEPT_ERRORS:
            del self.errors[MAX_KEPT_ERRORS // 2]  # the oldest of the latest half
            self.errors_dropped += 1

    def _set_stop(self, kind: StopKind, reason: str) -> None:
        """Record why the session stops (the first reason wins); `stopped` (which ends the harness)
        is set once the calls admitted before it are answered."""
        if self.stop is None:
            self.stop = SessionStop(kind=kind, reason=reason)
        if self._in_flight == 0:
            self.stopped.set()

    def _stop(self, kind: StopKind, reason: str) -> ApiError:
        self._set_stop(kind, reason)
        code = "context_length_exceeded" if kind == "context_overflow" else "rollout_budget_exceeded"
        return self.fail(400, reason, code=code)

    def _over(self) -> ApiError:
        assert self.stop is not None
        return self.fail(400, f"this rollout is over ({self.stop.kind}): {self.stop.reason}", code="rollout_budget_exceeded")

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """One call, admitted now: counted against `max_turns` on arrival (with the calls still in
        flight), then run once a generation slot is free. Raises the error answer when the session
        is over or its call limit is reached, as it is for calls made one after another."""
        if self.stop is not None:
            raise self._over()
        if len(self.calls) + self._in_flight >= self.limits.max_turns:
            raise self._stop("max_turns", f"the rollout's limit of {self.limits.max_turns} model calls is reached")
        self._in_flight += 1
        try:
            async with self._slots:
                if self._closed:
                    raise self.fail(400, "this rollout is over: its harness has ended", code="rollout_budget_exceeded")
                if self.stop is not None and self.stop.kind != "max_turns":  # admitted calls are within max_turns
                    raise self._over()
                yield
        finally:
            self._in_flight -= 1
            if self.stop is not None and self._in_flight == 0:
                self.stopped.set()

    def reserve(self, body: ChatBody) -> SamplingParams:
        """The run's sampling with the cap lowered to the request's and to the budget left, reserved
        from the budget until `sampled` ends (the caps of generations running count as spent);
        raises the error answer when the budget is spent."""
        spent = sum(len(call.completion_ids) for call in self.calls) + self._reserved_tokens
        left = self.limits.max_completion_tokens - spent
        if left <= 0:
            raise self._stop("budget", f"the rollout's budget of {self.limits.max_completion_tokens} completion tokens is spent")
        requested = body.max_completion_tokens or body.max_tokens or self.sampling.max_new_tokens
        sampling = replace(self.sampling, max_new_tokens=min(requested, self.sampling.max_new_tokens, left))
        self._reserved_tokens += sampling.max_new_tokens
        return sampling

    async def sampled(self, sampling: SamplingParams, generation: Awaitable[_Answer]) -> _Answer:
        """The answer of `generation` (sampled with `sampling`, reserved by `reserve`), run as a task
        `close` can end; the reservation ends with it. Raises the error answer of a failed backend
        or of a session closed meanwhile."""
        task = asyncio.ensure_future(generation)
        self._generations.add(task)
        try:
            return await task
        except (ContextOverflowError, BackendError) as error:
            raise self.backend_failed(error) from None
        except asyncio.CancelledError:
            if self._closed and task.cancelled():
                raise self.fail(400, "this rollout is over: its harness ended while this call was generating",
                                code="rollout_budget_exceeded") from None
            raise
        finally:
            self._reserved_tokens -= sampling.max_new_tokens
            self._generations.discard(task)

    async def close(self) -> None:
        """End the generations still running (the rollout is over: nothing may outlive it); their
        callers get an error answer, calls still waiting for a slot too."""
        self._closed = True
        running = list(self._generations)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    def backend_failed(self, error: ContextOverflowError | BackendError) -> ApiError:
        """The answer to a failed generation: a context overflow or a backend failure stops the session."""
        if isinstance(error, ContextOverflowError):
            return self._stop("context_overflow", f"This model's maximum context length is exceeded: {error}")
        self._set_stop("infra", f"generation backend: {error}")
        self._log_error(500, str(error))
        return ApiError(500, f"generation backend failed: {error}", "server_error")

    def chat_body(self, data: Any) -> ChatBody:
        """`data` as a chat-completions body this endpoint serves; a recorded error answer naming what to change."""
        body = self._validated(ChatBody, data)
        if body.stream_options is not None and not body.stream:
            raise self.fail(400, "stream_options is only allowed when stream is true", code="invalid_stream_options")
        if body.n != 1:
            raise self.fail(400, f"n={body.n} is not supported by the gym_bridge capture endpoint; send n=1", code="unsupported_parameter")
        if body.model not in (None, self.model_name):
            raise self.fail(404, f"The model `{body.model}` does not exist; this endpoint serves `{self.model_name}`",
                            code="model_not_found")
        if body.tool_choice not in (None, "auto", "none"):
            raise self.fail(400, "tool_choice must be 'auto' or 'none' on the gym_bridge capture endpoint", code="unsupported_parameter")
        return body

    async def responses(self, data: Any, chat_completions: ChatCompletions) -> dict[str, Any]:
        """The answer to one `/v1/responses` body as a Responses `response` object: the request is
        served as the chat-completions call it means (by the session's `chat_completions`), so capture
        and token-in are the chat path's."""
        body = self._validated(ResponsesBody, data)
        try:
            check_stateless(body)
            chat = to_chat_body(body)
        except ApiError as error:
            raise self.fail(error.status, error.message, code=error.code) from None
        return to_response(await chat_completions(chat), request=body)

    def _validated(self, model: type[_Body], data: Any) -> _Body:
        """`data` as a `model` request body; a recorded 400 naming the fields that are wrong."""
        if not isinstance(data, dict):
            raise self.fail(400, "request body must be a JSON object")
        try:
            return model.model_validate(data)
        except pydantic.ValidationError as error:
            raise self.fail(400, f"invalid request: {_problems(error)}") from None


def request_tools(body: ChatBody) -> list[dict[str, Any]] | None:
    """The request's tools as Responses function schemas; None when it offers none or `tool_choice` is 'none'."""
    use_tools = bool(body.tools) and body.tool_choice != "none"
    return [from_chat_tool(tool) for tool in body.tools or []] if use_tools else None


def _problems(error: pydantic.ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()[:5])
