"""The agent loop: generate, parse tool calls, run tools, append their outputs, repeat.

`RolloutContext` gives a loop the three things it may do — sample a model turn, call a tool,
append an environment message — and keeps the token stream append-only while doing them.
With a chat policy it keeps a message list instead: the same three steps append assistant and
tool messages. Hosted APIs return no token ids, so their records carry none (evaluation only); a
server that returns each call's token ids (NeMo RL's) gets them back on its assistant messages,
and the token stream is built from what it reports, checked to be contiguous across turns.
`ToolCallingLoop` is the default loop; an environment can name its own (`agent_loop`
attribute) for user simulation or game steps. Loops raise `RolloutFailure` for what is not the
policy's fault; what the policy gets wrong is scored, not raised.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, replace
from typing import Any, Protocol

from gym_bridge.core.bounded_call import call_bounded, call_environment
from gym_bridge.core.environment import Environment, ToolError
from gym_bridge.core.errors import AbortedCall, classify
from gym_bridge.core.errors import RolloutFailure as RolloutFailure
from gym_bridge.core.items import TOKEN_FIELDS, ChatMessage, function_call_item, function_call_output_item, message_item, reasoning_item, user_message_item
from gym_bridge.core.parsers.call import ParsedCall, ParsedTurn
from gym_bridge.core.policy import CallTokens, ChatPolicy, ChatRequest, ChatTurn, Generation, GenerationRequest, Policy, SamplingParams
from gym_bridge.core.task import Task
from gym_bridge.core.template import ChatTemplate, ToolOutput
from gym_bridge.core.toolcall import parse_turn
from gym_bridge.core.trajectory import Trajectory


@dataclass(frozen=True)
class Limits:
    """Bounds of one rollout."""

    max_turns: int = 8
    """Model calls at most."""
    max_completion_tokens: int = 2048
    """Model and environment tokens after the prompt, over all turns."""
    max_tool_output_chars: int = 100_000
    """Characters of one tool output the model reads at most; beyond them it reads a truncation note."""


OFF_LOOP_TOKENIZE_CHARS = 8192
"""Environment messages at least this long are tokenized in a worker thread, off the event loop."""


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


def _few_values(value: Any, budget: int) -> bool:
    """True when `value` holds at most `budget` containers and scalars and no string over `budget` characters."""
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
    """What a loop works with. Mutates `trajectory`; everything else is fixed."""

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
    messages: list[ChatMessage] | None = None
    """The conversation as chat messages when the policy is a `ChatPolicy`; None on the token path."""
    _last_token: int | None = None
    _items: int = 0

    def _item_id(self, prefix: str) -> str:
        self._items += 1
        return f"{prefix}_{self.session_id}_{self._items}"

    @property
    def budget_left(self) -> int:
        spent = len(self.trajectory.completion_ids) + self.trajectory.api_usage.get("output_tokens", 0)
        return self.limits.max_completion_tokens - spent

    async def generate(self) -> tuple[Generation, ParsedTurn] | None:
        """Sample one model turn and append it (ids, log-probs, items).

        Returns None when no token budget is left. Raises the policy's errors.
        """
        max_new = min(self.sampling.max_new_tokens, self.budget_left)
        if max_new <= 0:
            return None
        sampling = self.sampling if max_new == self.sampling.max_new_tokens else replace(self.sampling, max_new_tokens=max_new)
        if self.messages is not None:
            return await self._chat(sampling)
        assert self.template is not None
        trajectory = self.trajectory
        prompt_ids = trajectory.context_ids()
        request = GenerationRequest(prompt_ids=prompt_ids, sampling=sampling, session_id=self.session_id)
        generation = await self.policy.generate(request)  # type: ignore[union-attr]
        trajectory.append_model(generation.token_ids, generation.logprobs)
        ids = generation.token_ids
        self._last_token = ids[-1] if ids and ids[-1] in self.template.eos_token_ids else None
        text = generation.text
        if text is None:
            text = self.template.tokenizer.decode(ids[:-1] if self._last_token is not None else ids, skip_special_tokens=False)
        elif self._last_token is not None:
            text = text.removesuffix(self.template.closing_text(self._last_token))
        parsed = self.template.parse(text, prompt_ids=prompt_ids, tools=self.tools)
        self._count_parse(parsed)
        items = self._turn_items(parsed)
        items[-1]["prompt_token_ids"] = prompt_ids
        items[-1]["generation_token_ids"] = list(ids)
        items[-1]["generation_log_probs"] = list(generation.logprobs)
        trajectory.output.extend(items)
        return generation, parsed

    def _count_parse(self, parsed: ParsedTurn) -> None:
        if parsed.calls:
            self.trajectory.parse_errors += parsed.parse_errors
        elif parsed.unparsed_tool_call:
            self.trajectory.unparsed_tool_calls += 1

    def _turn_items(self, parsed: ParsedTurn) -> list[Any]:
        items: list[Any] = []
        if parsed.reasoning:
            items.append(reasoning_item(parsed.reasoning, item_id=self._item_id("rs")))
        if parsed.content or not parsed.calls:
            items.append(message_item(parsed.content, item_id=self._item_id("msg")))
        for call in parsed.calls:
            item_id = self._item_id("call")
            # the id the template renders for the model (Mistral: nine letters and digits), so records and prompts agree
            call_id = item_id if self.template is None else self.template.call_id(item_id.removeprefix("call_"), written=call.call_id)
            items.append(function_call_item(call.name, call.arguments, call_id=call_id, item_id=item_id))
        return items

    async def _chat(self, sampling: SamplingParams) -> tuple[Generation, ParsedTurn]:
        """One turn of a chat policy: items and an assistant message, plus the call's tokens when
        the server returned them (carried on the last item and on the assistant message)."""
        assert self.messages is not None
        request = ChatRequest(messages=list(self.messages), tools=self.tools, sampling=sampling, session_id=self.session_id)
        turn = await self.policy.chat(request)  # type: ignore[union-attr]
        if turn.tokens is None:
            self.trajectory.append_model([], [])
            self.trajectory.add_api_usage(turn.usage)
        else:
            self._append_call_tokens(turn.tokens)
        parsed = _parsed_chat_turn(turn)
        self._count_parse(parsed)
        items = self._turn_items(parsed)
        message: ChatMessage = {"role": "assistant", "content": parsed.content}
        if parsed.calls:
            message["tool_calls"] = [
                {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}
                for item in items if item["type"] == "function_call"
            ]
        if turn.tokens is not None:
            fields = dict(zip(TOKEN_FIELDS, (list(turn.tokens.prompt_token_ids), list(turn.tokens.generation_token_ids),
                                             list(turn.tokens.generation_log_probs))))
            items[-1].update(fields)
            message.update(fields)
        self.trajectory.output.extend(items)
        self.messages.append(message)
        tokens = turn.tokens
        return Generation(token_ids=list(tokens.generation_token_ids) if tokens else [], logprobs=list(tokens.generation_log_probs) if tokens else [],
                          finish_reason=turn.finish_reason, text=turn.text), parsed

    def _append_call_tokens(self, tokens: CallTokens) -> None:
        """Grow the token stream from a chat call's ids: its prompt must start with everything seen
        so far; what follows is environment tokens (the server's rendering of the new messages)."""
        trajectory = self.trajectory
        prompt = list(tokens.prompt_token_ids)
        if trajectory.model_calls == 0:
            trajectory.prompt_ids = prompt
        else:
            seen = trajectory.context_ids()
            if not trajectory.prompt_ids or prompt[: len(seen)] != seen:
                at = next((i for i, (a, b) in enumerate(zip(prompt, seen)) if a != b), min(len(prompt), len(seen)))
                raise RolloutFailure(
                    "infra",
                    f"the model server's prompt token ids for call {trajectory.model_calls + 1} do not start with the "
                    f"{len(seen)} tokens of the earlier calls (first difference at position {at}); the server must keep "
                    "the prefix exact from the token ids sent back on the assistant messages",
                )
            trajectory.append_env(prompt[len(seen):])
        trajectory.append_model(list(tokens.generation_token_ids), list(tokens.generation_log_probs))

    async def call_tool(self, call: ParsedCall, call_id: str) -> ToolOutput:
        """Run one tool call; bad calls become error text for the model.

        Raises RolloutFailure(`env`) when the tool itself crashes, hangs or returns non-JSON.
        """
        self.trajectory.tool_calls += 1
        offered = {schema["name"] for schema in self.tools}
        if call.error:
            content = json.dumps({"error": f"malformed tool call: {call.error}"})
        elif call.name not in offered or (call.name not in self.env.tool_specs() and not type(self.env).tools_from_row):
            content = json.dumps({"error": f"unknown tool {call.name!r}; available tools: {sorted(offered)}"})
        else:
            content = await self._run_tool(call.name, call.arguments)
        self.trajectory.output.append(function_call_output_item(content, call_id=call_id))
        return ToolOutput(name=call.name, content=content, call_id=call_id)

    async def _run_tool(self, name: str, arguments: str) -> str:
        """The tool's output as the model reads it (`Environment.call_tool`'s text, or its JSON, cut at
        `max_tool_output_chars`; a ToolError, invalid arguments included, as `{"error": ...}`)."""
        env_class = type(self.env)
        timeout_s = env_class.tool_timeout_s
        spec = env_class.tool_specs().get(name)
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
            encoded: str = await call_bounded(encode_capped, result, max_chars, timeout_s=_TOKENIZE_TIMEOUT_S, owner="tool output")
            return encoded
        except (TypeError, ValueError) as error:
            raise RolloutFailure("env", f"tool {name!r} returned a value that is not JSON-serializable: {error}") from None

    async def _call_async_tool(self, name: str, arguments: str) -> Any:
        """`call_tool` of an async tool, awaited on the event loop."""
        return await self.env.call_tool(name, arguments)

    def append_tool_outputs(self, outputs: list[ToolOutput]) -> bool:
        """Append the rendered tool outputs and the next generation prompt, tokenizing on this thread.

        Returns False (appending nothing) when they do not fit the token budget. In a loop,
        prefer `await append_tool_outputs_async(...)`, which keeps long outputs off the event loop.
        """
        if self.messages is not None:
            self.messages.extend({"role": "tool", "tool_call_id": out.call_id, "name": out.name, "content": out.content} for out in outputs)
            return True
        assert self.template is not None
        return self._append_env(self.template.tool_delta_ids(outputs, last_token_id=self._last_token))

    async def append_tool_outputs_async(self, outputs: list[ToolOutput]) -> bool:
        """`append_tool_outputs`, with long outputs tokenized in a worker thread so other rollouts go on."""
        if self.messages is not None or sum(len(out.content) for out in outputs) < OFF_LOOP_TOKENIZE_CHARS:
            return self.append_tool_outputs(outputs)
        assert self.template is not None
        template, last_token = self.template, self._last_token
        delta = await call_bounded(lambda: template.tool_delta_ids(outputs, last_token_id=last_token),
                                   timeout_s=_TOKENIZE_TIMEOUT_S, owner="tokenizer")
        return self._append_env(delta)

    def append_user_message(self, content: str) -> bool:
        """Append a user message (simulated users, game observations) to the stream and, as a
        `message` item with role `user`, to the output; False (nothing appended) if it does not fit.

        Tokenizes on this thread; in a loop prefer `await append_user_message_async(...)`.
        """
        if self.messages is not None:
            self.messages.append({"role": "user", "content": content})
        else:
            assert self.template is not None
            if not self._append_env(self.template.user_delta_ids(content, last_token_id=self._last_token)):
                return False
        self._user_item(content)
        return True

    async def append_user_message_async(self, content: str) -> bool:
        """`append_user_message`, with a long message tokenized in a worker thread so other rollouts go on."""
        if self.messages is not None or len(content) < OFF_LOOP_TOKENIZE_CHARS:
            return self.append_user_message(content)
        assert self.template is not None
        template, last_token = self.template, self._last_token
        delta = await call_bounded(lambda: template.user_delta_ids(content, last_token_id=last_token),
                                   timeout_s=_TOKENIZE_TIMEOUT_S, owner="tokenizer")
        if not self._append_env(delta):
            return False
        self._user_item(content)
        return True

    def _user_item(self, content: str) -> None:
        """The user message in the output, as a `message` item with role `user`."""
        self.trajectory.output.append(user_message_item(content, item_id=self._item_id("msg")))

    def _append_env(self, delta: list[int]) -> bool:
        if len(delta) >= self.budget_left:
            return False
        self.trajectory.append_env(delta)
        return True


_TOKENIZE_TIMEOUT_S = 600.0
"""A bound on tokenizing one environment message; the rollout's deadline usually ends it first."""


def _parsed_chat_turn(turn: ChatTurn) -> ParsedTurn:
    """A chat API's turn as the loop sees it; tool calls written as text (a server without a tool
    parser) are parsed like a token policy's."""
    if not turn.tool_calls:
        parsed = parse_turn(turn.text)
        return replace(parsed, reasoning=turn.reasoning or parsed.reasoning)
    calls = []
    for call in turn.tool_calls:
        try:
            arguments = json.loads(call.arguments) if call.arguments.strip() else {}
        except json.JSONDecodeError:
            calls.append(ParsedCall(name=call.name, arguments=call.arguments, error="'arguments' is not valid JSON"))
            continue
        if not isinstance(arguments, dict):
            calls.append(ParsedCall(name=call.name, arguments=call.arguments, error="'arguments' must be a JSON object"))
        else:
            calls.append(ParsedCall(name=call.name, arguments=json.dumps(arguments)))
    return ParsedTurn(reasoning=turn.reasoning, content=turn.text.strip(), calls=tuple(calls))


class AgentLoop(Protocol):
    """Drives one rollout; returns its finish reason (`answer`, `max_turns`, `length`, `budget`)."""

    async def run(self, ctx: RolloutContext) -> str: ...


class ToolCallingLoop:
    """Generate; if the turn calls tools, run them and continue; stop on an answer or a limit."""

    async def run(self, ctx: RolloutContext) -> str:
        for turn in range(ctx.limits.max_turns):
            step = await ctx.generate()
            if step is None:
                return "budget"
            generation, parsed = step
            if generation.finish_reason == "length":
                return "length"
            if not parsed.calls:
                return "answer"
            call_ids = [item["call_id"] for item in ctx.trajectory.output[-len(parsed.calls):]]  # type: ignore[typeddict-item]
            outputs = [await ctx.call_tool(call, call_id) for call, call_id in zip(parsed.calls, call_ids)]
            if turn == ctx.limits.max_turns - 1:
                return "max_turns"
            if not await ctx.append_tool_outputs_async(outputs):
                return "budget"
        return "max_turns"
