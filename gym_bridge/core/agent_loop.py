"""The agent loop: generate, parse tool calls, run tools, append their outputs, repeat.

`RolloutContext` gives a loop what it may do — sample a model turn, call a tool, append tool
outputs or a user message — over the rollout's `Transcript` (`gym_bridge.core.transcript`: a
token stream for a token policy, chat messages for a chat policy; the loop never knows which).
`ToolCallingLoop` is the default loop; an environment can name its own (`agent_loop`
attribute) for user simulation or game steps. Loops raise `FailRollout` for what is not the
policy's fault; what the policy gets wrong is scored, not raised.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol, Sequence

from gym_bridge.core.bounded.deadline import RolloutDeadline
from gym_bridge.core.environment import Environment
from gym_bridge.core.items import function_call_output_item
from gym_bridge.core.turn import ToolCall, Turn
from gym_bridge.core.policy import ChatPolicy, Policy, SamplingParams
from gym_bridge.core.record import LoopFinish
from gym_bridge.core.task import Task
from gym_bridge.core.template.chat_template import ChatTemplate
from gym_bridge.core.template.messages import ToolOutput
from gym_bridge.core.session import Session
from gym_bridge.core.trajectory import Trajectory
from gym_bridge.core.transcript import Transcript
from gym_bridge.core.trust import DEFAULT_TRUST, TrustSettings


@dataclass(frozen=True)
class Limits:
    """Bounds of one rollout."""

    max_turns: int = 8
    """Model calls at most."""
    max_completion_tokens: int = 2048
    """Model and environment tokens after the prompt, over all turns."""
    max_tool_output_chars: int = 100_000
    """Characters of one tool output the model reads at most; beyond them it reads a truncation note."""


@dataclass
class RolloutContext:
    """What a loop works with: its task and environment, and the rollout's transcript, which it
    grows only through the methods below. Mutates `trajectory`; everything else is fixed. Tool calls and user
    messages go through `session` (the environment's session, or the resume journal's wrapper around it)."""

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
    session: Session
    """Where tool calls run and user messages are noted (`gym_bridge.core.session`)."""
    deadline: RolloutDeadline
    """The rollout's deadline, which model calls go through."""
    trust: TrustSettings = DEFAULT_TRUST
    """What the run's data may run (`gym_bridge.core.trust`): a harness row's own command, say."""

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
        async with self.deadline.model_call():
            return await self.transcript.generate(sampling)

    def with_tools(self, tools: Sequence[dict[str, Any]]) -> RolloutContext:
        """A copy of this context that also offers `tools` (functions an environment adds mid-episode); the loop goes
        on with the copy. The transcript and the session are shared: the session accepts calls of them from now on,
        and the model learns of them from what the environment tells it."""
        self.session.offer(tools)
        return replace(self, tools=(*self.tools, *tools))

    async def call_tool(self, call: ToolCall, call_id: str | None = None) -> ToolOutput:
        """Run one tool call (`call_id`: the call's own, as `generate` returned it, unless given);
        bad calls become error text for the model.

        Raises FailRollout(`env`) when the tool itself crashes, hangs or returns non-JSON.
        """
        call_id = call_id or call.id or ""
        self.trajectory.tool_calls += 1
        content = await self.session.call_tool(call)
        self.trajectory.output.append(function_call_output_item(content, call_id=call_id))
        return ToolOutput(name=call.name, content=content, call_id=call_id)

    async def append_tool_outputs_async(self, outputs: Sequence[ToolOutput]) -> bool:
        """Append the tool outputs for the model to read next (for a token policy: rendered, with the
        next generation prompt; long ones tokenized in a worker thread so other rollouts go on).

        Returns False (appending nothing) when they do not fit the token budget.
        """
        return await self.transcript.append_tool_outputs(outputs)

    async def append_user_message_async(self, content: str) -> bool:
        """Append a user message (simulated users, game observations) to the transcript and, as a
        `message` item with role `user`, to the output; False (nothing appended) if it does not fit."""
        self.session.user_message(content)
        return await self.transcript.append_user_message(content)


async def generate_turn(ctx: RolloutContext) -> Turn | LoopFinish:
    """One model turn (`ctx.generate`), or the finish reason that ends the loop instead: `budget` when no token is
    left, `length` when the turn was cut at its token limit (a cut turn is not acted on). Loops share it."""
    step = await ctx.generate()
    if step is None:
        return "budget"
    if step.finish_reason == "length":
        return "length"
    return step


class AgentLoop(Protocol):
    """Drives one rollout; returns its finish reason (`answer`, `max_turns`, `length`, `budget`)."""

    async def run(self, ctx: RolloutContext) -> LoopFinish: ...


class ToolCallingLoop:
    """Generate; if the turn calls tools, run them and continue; stop on an answer or a limit."""

    async def run(self, ctx: RolloutContext) -> LoopFinish:
        for turn in range(ctx.limits.max_turns):
            step = await generate_turn(ctx)
            if isinstance(step, str):
                return step
            if not step.calls:
                return "answer"
            outputs = []
            for call in step.calls:
                outputs.append(await ctx.call_tool(call))
            if ctx.env.episode_ended():
                return "answer"
            if turn == ctx.limits.max_turns - 1:
                return "max_turns"
            if not await ctx.append_tool_outputs_async(outputs):
                return "budget"
        return "max_turns"
