"""The environment session of one episode: setup (or restore), tool calls, verify and close, each bounded.

`EnvironmentSession` is the one owner of that sequence, used by the engine's rollouts, `gym-bridge verify`'s re-scoring
and `gym-bridge env check`. A tool call's output is what the model reads: the tool's text or JSON, cut at a character
limit, or `{"error": ...}` for a bad call. `RolloutSeams` is what may wrap one attempt of a rollout (its policy and its
session): nothing (`PLAIN`), or the resume journal's wrappers (`gym_bridge.core.resume`).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Protocol, Sequence

from gym_bridge.core.bounded.call import call_bounded, call_environment
from gym_bridge.core.environment import Environment, ToolError, ToolSpec, VerifyResult, to_verify_result
from gym_bridge.core.errors import AbortedCall, FailRollout, Step, classify
from gym_bridge.core.items import Item
from gym_bridge.core.policy import ChatPolicy, Policy
from gym_bridge.core.task import Task
from gym_bridge.core.turn import ToolCall
from gym_bridge.core.trajectory import Trajectory
from gym_bridge.core.transcript import TOKENIZE_TIMEOUT_S

INLINE_ENCODE_VALUES = 1000
"""Tool results holding at most this many values (and no long string) are encoded on the event loop."""
_SCALARS = (int, float, bool, type(None))


def capped_output(content: str, max_chars: int) -> str:
    """`content`, or its first `max_chars` characters and a note saying how much was cut."""
    if len(content) <= max_chars:
        return content
    return f"{content[:max_chars]}\n[truncated by gym_bridge: the tool returned {len(content):,} characters; only the first {max_chars:,} are shown]"


def encode_capped(value: Any, max_chars: int) -> str:
    """`value` as JSON (`json.dumps`'s text), encoded only as far as `max_chars`: beyond them, the
    first `max_chars` characters and a note. Pure-Python encoding, piece by piece, so a tool that
    returns millions of values costs what the model reads, and the thread running it yields the GIL."""
    pieces: list[str] = []
    size = 0
    for piece in json.JSONEncoder().iterencode(value):
        pieces.append(piece)
        size += len(piece)
        if size > max_chars:
            shown = "".join(pieces)[:max_chars]
            return f"{shown}\n[truncated by gym_bridge: the tool returned more than {max_chars:,} characters; only the first {max_chars:,} are shown]"
    return "".join(pieces)


def few_values(value: Any, budget: int) -> bool:
    """True when `value` holds at most `budget` containers and scalars and no string over `budget` characters."""
    containers, seen = [value], 1
    while containers:
        item = containers.pop()
        if isinstance(item, str):
            if len(item) > budget:
                return False
            continue
        if not isinstance(item, (dict, list, tuple)):
            continue
        children = (*item.keys(), *item.values()) if isinstance(item, dict) else item
        seen += len(children)
        if seen > budget:
            return False
        for child in children:  # only what may hold more (containers) or be long (strings) is looked at again
            if not isinstance(child, _SCALARS):
                containers.append(child)
    return True


async def call_step(env: Environment, method: str, args: tuple[Any, ...] = (), *, step: Step, timeout_s: float, what: str = "") -> Any:
    """`env.<method>(*args)` under `timeout_s`; whatever it raises is raised as the FailRollout `classify` makes of it."""
    try:
        return await call_environment(env, method, args, timeout_s=timeout_s)
    except Exception as error:
        raise classify(error, step=step, what=what, timeout_s=timeout_s) from None


def _overrides(env_class: type[Environment], name: str) -> bool:
    return getattr(env_class, name) is not getattr(Environment, name)


class Session(Protocol):
    """What a rollout's engine and loop call on its environment: an `EnvironmentSession`, or a wrapper around one."""

    @property
    def env(self) -> Environment: ...

    async def setup(self, task: Task) -> None: ...

    async def call_tool(self, call: ToolCall) -> str: ...

    def offer(self, tools: Sequence[dict[str, Any]]) -> None:
        """Accept calls of `tools` too from now on (functions an environment adds mid-episode)."""
        ...

    def user_message(self, content: str) -> None: ...

    async def verify(self, task: Task, output: list[Item]) -> VerifyResult: ...

    async def close(self) -> FailRollout | None: ...


class EnvironmentSession:
    """One instance of `env_class` through one episode. `tools`: the tool schemas offered to the model (a call of
    another tool is an error the model reads); `max_tool_output_chars`: what the model reads of one output at most."""

    def __init__(self, env_class: type[Environment], *, tools: tuple[dict[str, Any], ...] | None = None,
                 max_tool_output_chars: int = 100_000) -> None:
        self.env_class = env_class
        self.tools = tuple(spec.schema for spec in env_class.tool_specs().values()) if tools is None else tools
        self.max_tool_output_chars = max_tool_output_chars
        self._offered: frozenset[str] | None = None
        self.env = env_class()

    @property
    def offered(self) -> frozenset[str]:
        """The names of the tools the model may call (found at the first call: a rollout that calls none needs none)."""
        if self._offered is None:
            self._offered = frozenset(schema["name"] for schema in self.tools)
        return self._offered

    async def setup(self, task: Task) -> None:
        """`setup(task)` (when the environment has one) under the tool timeout; raises FailRollout(`setup`)."""
        if _overrides(self.env_class, "setup"):
            await call_step(self.env, "setup", (task,), step="setup", timeout_s=self.env_class.tool_timeout_s)

    def offer(self, tools: Sequence[dict[str, Any]]) -> None:
        """Accept calls of `tools` too from now on (functions an environment adds mid-episode)."""
        self.tools = (*self.tools, *tools)
        self._offered = None

    async def restore(self, task: Task, state: Any) -> None:
        """`restore(task, state)` in place of `setup`, under the tool timeout; raises FailRollout(`setup`)."""
        await call_step(self.env, "restore", (task, state), step="setup", timeout_s=self.env_class.tool_timeout_s)

    async def snapshot(self) -> Any:
        """`snapshot()` in a worker thread under the tool timeout; raises FailRollout(`env`) naming it."""
        return await call_step(self.env, "snapshot", step="tool", what="snapshot()", timeout_s=self.env_class.tool_timeout_s)

    async def call_tool(self, call: ToolCall) -> str:
        """The output of `call` as the model reads it: the tool's text, or its JSON, cut at `max_tool_output_chars`; a
        malformed call, an unknown tool or a ToolError (invalid arguments included) as `{"error": ...}`.

        Raises FailRollout(`env`) when the tool itself crashes, hangs or returns what is not JSON data."""
        spec = self.env_class.tool_specs().get(call.name)
        if call.error:
            return json.dumps({"error": f"malformed tool call: {call.error}"})
        if call.name not in self.offered or (spec is None and not self.env_class.tools_from_row):
            return json.dumps({"error": f"unknown tool {call.name!r}; available tools: {sorted(self.offered)}"})
        try:
            result = await self._run(call.name, call.arguments, spec)
        except ToolError as error:
            return json.dumps({"error": str(error)})
        except Exception as error:
            raise classify(error, step="tool", what=f"tool {call.name!r}", timeout_s=self.env_class.tool_timeout_s) from None
        return await self._encode(call.name, result)

    async def _run(self, name: str, arguments: str, spec: ToolSpec | None) -> Any:
        env_class, timeout_s = self.env_class, self.env_class.tool_timeout_s
        if spec is not None and not env_class.isolate_tools and spec.is_async:
            return await call_bounded(self._call_async_tool, name, arguments, timeout_s=timeout_s, owner=env_class.name)
        if spec is not None and not env_class.isolate_tools and env_class.inline_sync_tools:
            try:
                return self.env.call_tool(name, arguments)
            except (SystemExit, KeyboardInterrupt, asyncio.CancelledError) as error:
                raise AbortedCall(error) from None
        return await call_environment(self.env, "call_tool", (name, arguments), timeout_s=timeout_s)

    async def _call_async_tool(self, name: str, arguments: str) -> Any:
        return await self.env.call_tool(name, arguments)

    async def _encode(self, name: str, result: Any) -> str:
        max_chars = self.max_tool_output_chars
        if isinstance(result, str):
            return capped_output(result, max_chars)
        try:
            if few_values(result, INLINE_ENCODE_VALUES):
                return capped_output(json.dumps(result), max_chars)
            encoded: str = await call_bounded(encode_capped, result, max_chars, timeout_s=TOKENIZE_TIMEOUT_S, owner="tool output")
            return encoded
        except (TypeError, ValueError) as error:
            raise FailRollout("env", f"tool {name!r} returned a value that is not JSON-serializable: {error}") from None

    def user_message(self, content: str) -> None:
        """A user message the loop appends: nothing to do here (a journaled session records it)."""

    async def verify(self, task: Task, output: list[Item]) -> VerifyResult:
        """`verify(task, output)` under the verify timeout, as a VerifyResult. Raises FailRollout(`verifier`) when verify
        raises, hangs or returns something that is not a score."""
        result = await call_step(self.env, "verify", (task, output), step="verify", timeout_s=self.env_class.verify_timeout_s)
        try:
            return to_verify_result(result)
        except (TypeError, ValueError) as error:
            raise FailRollout("verifier", str(error)) from None

    async def close(self) -> FailRollout | None:
        """`close()` (when the environment has one) under the tool timeout; returns the FailRollout it ended in, if any."""
        if not _overrides(self.env_class, "close"):
            return None
        try:
            await call_step(self.env, "close", step="close", what="close()", timeout_s=self.env_class.tool_timeout_s)
        except FailRollout as error:
            return error
        return None


class RolloutSeams(Protocol):
    """What wraps one attempt of a rollout: the policy its transcript calls and the session its tools run in.
    `PLAIN` wraps nothing; the resume journal's `RolloutResume` replays committed turns and records new ones."""

    @property
    def spent_s(self) -> float:
        """Seconds earlier attempts of this rollout used, charged to its deadline."""
        ...

    def wrap_policy(self, policy: Policy | ChatPolicy) -> Policy | ChatPolicy: ...

    def wrap_session(self, session: EnvironmentSession, trajectory: Trajectory) -> Session: ...


class _Plain:
    """The seams of a rollout that is not journaled: the policy and the session as they are."""

    spent_s = 0.0

    def wrap_policy(self, policy: Policy | ChatPolicy) -> Policy | ChatPolicy:
        return policy

    def wrap_session(self, session: EnvironmentSession, trajectory: Trajectory) -> Session:
        return session


PLAIN: RolloutSeams = _Plain()
