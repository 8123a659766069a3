"""The agent loop: generate, parse tool calls, run tools, append their outputs, repeat.

`RolloutContext` gives a loop what it may do — sample a model turn, call a tool, append tool
outputs or a user message — over the rollout's `Transcript` (`gym_bridge.core.transcript`: a
token stream for a token policy, chat messages for a chat policy; the loop never knows which).
`ToolCallingLoop` is the default loop; an environment can name its own (`agent_loop`
attribute) for user simulation or game steps. Loops raise `FailRollout` for what is not the
policy's fault; what the policy gets wrong is scored, not raised.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Coroutine, Protocol, Sequence

from gym_bridge.core.bounded.call import call_bounded, call_environment
from gym_bridge.core.bounded.deadline import RolloutDeadline
from gym_bridge.core.environment import Environment, ToolError, ToolSpec
from gym_bridge.core.errors import AbortedCall, classify, FailRollout
from gym_bridge.core.items import function_call_output_item
from gym_bridge.core.turn import ToolCall, Turn
from gym_bridge.core.policy import ChatPolicy, Policy, SamplingParams
from gym_bridge.core.record import LoopFinish
from gym_bridge.core.task import Task
from gym_bridge.core.template.chat_template import ChatTemplate
from gym_bridge.core.template.messages import ToolOutput
from gym_bridge.core.trajectory import Trajectory
from gym_bridge.core.transcript import TOKENIZE_TIMEOUT_S, Transcript

if TYPE_CHECKING:
    from gym_bridge.core.resume import RolloutResume


@dataclass(frozen=True)
class Limits:
    """Bounds of one rollout."""

    max_turns: int = 8
    """Model calls at most."""
    max_completion_tokens: int = 2048
    """Model and environment tokens after the prompt, over all turns."""
    max_tool_output_chars: int = 100_000
    """Characters of one tool output the model reads at most; beyond them it reads a truncation note."""


def capped_output(content: str, max_chars: int) -> str:
    """`content`, or its first `max_chars` characters and a note saying how much was cut."""
    if len(content) <= max_chars:
        return content
    return f"{content[:max_chars]}\n[truncated by gym_bridge: the tool returned {len(content):,} characters; only the first {max_chars:,} are shown]"


INLINE_ENCODE_VALUES = 1000
"""Tool results holding at most this many values (and no long string) are encoded on the event loop."""


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


_SCALARS = (int, float, bool, type(None))


def _few_values(value: Any, budget: int) -> bool:
    """True when `value` holds at most `budget` containers and scalars and no string over `budget` characters."""
    if type(value) is dict and len(value) <= 16:  # the common result: a small flat object, checked without the walk
        if all(type(key) is str and len(key) <= budget for key in value) and all(
                isinstance(item, _SCALARS) or (type(item) is str and len(item) <= budget) for item in value.values()):
            return True
    stack, seen = [value], 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > budget:
            return False
        if isinstance(item, (dict, list, tuple)):
            if seen + len(stack) + 2 * len(item) > budget:
                return False
            stack.extend((*item.keys(), *item.values()) if isinstance(item, dict) else item)
        elif isinstance(item, str) and len(item) > budget:
            return False
    return True


@dataclass
class RolloutContext:
    """What a loop works with: its task and environment, and the rollout's transcript, which it
    grows only through the methods below. Mutates `trajectory`; everything else is fixed."""

    task: Task
    env: Environment
    policy: Policy | ChatPolicy
    template: ChatTemplate | None
    """None with a chat policy."""
    sampling: SamplingParams
    limits: Limits
    trajectory: Trajectory
    session_id: str
    tools: tuple[dict[str, Any], ...]
    transcript: Transcript
    """The conversation as the policy reads it (tokens or chat messages); `Engine` starts it."""
    deadline: RolloutDeadline | None = None
    """The rollout's deadline, which model calls go through (`Engine` passes it; None: no bound here)."""
    _tool_names: frozenset[str] | None = None
    """The names of `tools`, once a call needs them."""
    journal: RolloutResume | None = None
    """Where tool outputs and user messages are journaled (or, resuming, replayed from); None: not journaled."""

    @property
    def budget_left(self) -> int:
        return self.limits.max_completion_tokens - self.trajectory.tokens_spent

    async def generate(self) -> Turn | None:
        """Sample one model turn and append it (ids, log-probs, items); each of the returned turn's
        calls carries the id it has in the record.

        Returns None when no token budget is left. Raises the policy's errors, and FailRollout(`timeout`)
        when a call the trainer may park runs past its own bound (`gym_bridge.core.bounded.deadline`).
        """
        max_new = min(self.sampling.max_new_tokens, self.budget_left)
        if max_new <= 0:
            return None
        sampling = self.sampling if max_new == self.sampling.max_new_tokens else replace(self.sampling, max_new_tokens=max_new)
        deadline = self.deadline
        if deadline is None or not deadline.parked:  # the call counts against the deadline: nothing to hold
            return await self.transcript.generate(sampling)
        async with deadline.model_call():
            return await self.transcript.generate(sampling)

    async def call_tool(self, call: ToolCall, call_id: str | None = None) -> ToolOutput:
        """Run one tool call (`call_id`: the call's own, as `generate` returned it, unless given);
        bad calls become error text for the model.

        Raises FailRollout(`env`) when the tool itself crashes, hangs or returns non-JSON.
        """
        call_id = call_id or call.id or ""
        self.trajectory.tool_calls += 1
        if self.journal is None:
            content = await self._tool_content(call)
        else:
            content = await self.journal.tool_output(call, self._tool_content)
        self.trajectory.output.append(function_call_output_item(content, call_id=call_id))
        return ToolOutput(name=call.name, content=content, call_id=call_id)

    def _tool_content(self, call: ToolCall) -> Coroutine[Any, Any, str]:
        """The coroutine of `call`'s output: `_run_tool`'s itself (no frame of its own on every call), or an
        error text for the model."""
        spec = type(self.env).tool_specs().get(call.name)
        offered = self._tool_names
        if offered is None:
            offered = self._tool_names = frozenset(schema["name"] for schema in self.tools)
        if call.error:
            return _text(json.dumps({"error": f"malformed tool call: {call.error}"}))
        if call.name not in offered or (spec is None and not type(self.env).tools_from_row):
            return _text(json.dumps({"error": f"unknown tool {call.name!r}; available tools: {sorted(offered)}"}))
        return self._run_tool(call.name, call.arguments, spec)

    async def _run_tool(self, name: str, arguments: str, spec: ToolSpec | None) -> str:
        """The tool's output as the model reads it (`Environment.call_tool`'s text, or its JSON, cut at
        `max_tool_output_chars`; a ToolError, invalid arguments included, as `{"error": ...}`)."""
        env_class = type(self.env)
        timeout_s = env_class.tool_timeout_s
        try:
            if spec is not None and not env_class.isolate_tools and spec.is_async:
                result = await call_bounded(self._call_async_tool, name, arguments, timeout_s=timeout_s, owner=env_class.name)
            elif spec is not None and not env_class.isolate_tools and env_class.inline_sync_tools:
                try:
                    result = self.env.call_tool(name, arguments)
                except (SystemExit, KeyboardInterrupt, asyncio.CancelledError) as error:
                    raise AbortedCall(error) from None
            else:
                result = await call_environment(self.env, "call_tool", (name, arguments), timeout_s=timeout_s)
        except ToolError as error:
            return json.dumps({"error": str(error)})
        except Exception as error:
            raise classify(error, step="tool", what=f"tool {name!r}", timeout_s=timeout_s) from None
        max_chars = self.limits.max_tool_output_chars
        if isinstance(result, str):
            return capped_output(result, max_chars)
        try:
            if _few_values(result, INLINE_ENCODE_VALUES):
                return capped_output(json.dumps(result), max_chars)
            encoded: str = await call_bounded(encode_capped, result, max_chars, timeout_s=TOKENIZE_TIMEOUT_S, owner="tool output")
            return encoded
        except (TypeError, ValueError) as error:
            raise FailRollout("env", f"tool {name!r} returned a value that is not JSON-serializable: {error}") from None

    async def _call_async_tool(self, name: str, arguments: str) -> Any:
        """`call_tool` of an async tool, awaited on the event loop."""
        return await self.env.call_tool(name, arguments)

    async def append_tool_outputs_async(self, outputs: Sequence[ToolOutput]) -> bool:
        """Append the tool outputs for the model to read next (for a token policy: rendered, with the
        next generation prompt; long ones tokenized in a worker thread so other rollouts go on).

        Returns False (appending nothing) when they do not fit the token budget.
        """
        return await self.transcript.append_tool_outputs(outputs)

    async def append_user_message_async(self, content: str) -> bool:
        """Append a user message (simulated users, game observations) to the transcript and, as a
        `message` item with role `user`, to the output; False (nothing appended) if it does not fit."""
        if self.journal is not None:
            self.journal.user_message(content)
        return await self.transcript.append_user_message(content)


async def _text(content: str) -> str:
    return content


class AgentLoop(Protocol):
    """Drives one rollout; returns its finish reason (`answer`, `max_turns`, `length`, `budget`)."""

    async def run(self, ctx: RolloutContext) -> LoopFinish: ...


class ToolCallingLoop:
    """Generate; if the turn calls tools, run them and continue; stop on an answer or a limit."""

    async def run(self, ctx: RolloutContext) -> LoopFinish:
        for turn in range(ctx.limits.max_turns):
            step = await ctx.generate()
            if step is None:
                return "budget"
            if step.finish_reason == "length":
                return "length"
            if not step.calls:
                return "answer"
            outputs = []
            for call in step.calls:  # a loop, not an async comprehension: no closure and frame per turn
                outputs.append(await ctx.call_tool(call))
            if turn == ctx.limits.max_turns - 1:
                return "max_turns"
            if not await ctx.append_tool_outputs_async(outputs):
                return "budget"
        return "max_turns"
