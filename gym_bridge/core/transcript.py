"""A rollout's conversation in the form its policy reads: a token stream or a list of chat messages.

`Transcript` is the one protocol an agent loop drives through `RolloutContext`: sample a model
turn, append tool outputs, append a user message, and finish with the token view of the record.
`TokenTranscript` keeps the append-only token stream of a token policy (ids in, ids and log-probs
out; the chat template renders what the environment adds). `MessageTranscript` keeps the chat
messages of a chat policy; a hosted API gives no token ids (its records carry none), a server
that returns each call's ids (NeMo RL's) gets them back on its assistant messages, and the token
stream is built from what it reports, checked to be contiguous across calls. The engine picks the
kind once per policy (`transcript_starter`); both write the same Responses items through the
`TrajectoryWriter` each holds (composition, no base class). The capture endpoint's sessions hold them
too, one per conversation a harness sends (`ServedTranscript`, a token transcript and its messages).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from itertools import chain, islice
from typing import Any, Awaitable, Callable, Mapping, NamedTuple, Protocol, Sequence

from gym_bridge.core.bounded.call import call_bounded
from gym_bridge.core.conversation import AssistantMessage, Message, TemplateMessage, appended, assistant_message, tool_message
from gym_bridge.core.dialects.chat import MessageIn
from gym_bridge.core.dialects.template_view import task_template_messages, template_messages
from gym_bridge.core.errors import FailRollout
from gym_bridge.core.items import Item, function_call_output_item, turn_items, user_message_item
from gym_bridge.core.policy import ChatPolicy, ChatRequest, Generation, GenerationRequest, Policy, SamplingParams, by_policy_kind
from gym_bridge.core.task import Task
from gym_bridge.core.template.chat_template import ChatTemplate
from gym_bridge.core.template.messages import ToolOutput
from gym_bridge.core.toolcall import parse_turn
from gym_bridge.core.trajectory import TokenView, Trajectory, extends, first_difference
from gym_bridge.core.turn import CallTokens, ToolCall, Turn

OFF_LOOP_TOKENIZE_CHARS = 8192
"""Environment messages at least this long are tokenized in a worker thread, off the event loop."""
TOKENIZE_TIMEOUT_S = 600.0
"""A bound on tokenizing one environment message; the rollout's deadline usually ends it first."""


class Transcript(Protocol):
    """One rollout's conversation as its policy reads it; writes the trajectory's tokens and items."""

    async def generate(self, sampling: SamplingParams) -> Turn:
        """Sample one model turn and append it: its items and, where the policy gives them, its token ids and
        log-probs. Returns the turn, each call with the id it got in the record; raises the policy's errors."""
        ...

    async def append_tool_outputs(self, outputs: Sequence[ToolOutput]) -> bool:
        """Append tool outputs for the model to read next; False (nothing appended) when they do not fit the token budget."""
        ...

    async def append_user_message(self, content: str) -> bool:
        """Append a user message (and its `message` item); False (nothing appended) when it does not fit."""
        ...

    def finish(self) -> TokenView:
        """The token view of the record (empty lists for a chat API that gives no token ids)."""
        ...


class ItemIds:
    """Numbers a conversation's items `<prefix>_<label>_<n>`, n counting every item from 1; one per rollout,
    shared by the transcripts of a capture session's conversations (so their items never share an id)."""

    __slots__ = ("label", "count")

    def __init__(self, label: str) -> None:
        self.label = label
        self.count = 0

    def __call__(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}_{self.label}_{self.count}"


class TurnItemIds(NamedTuple):
    """The ids of one model turn's items (`TrajectoryWriter.number`); '' for an item the turn does not have."""

    reasoning: str
    message: str
    calls: list[str]


def named_calls(calls: Sequence[ToolCall], item_ids: Sequence[str], call_id: Callable[[str, ToolCall], str]) -> tuple[ToolCall, ...]:
    """`calls`, each with the id it has in the record: `call_id(item_id, call)`, `item_ids` their items' ids."""
    return tuple(ToolCall(id=call_id(item_id, call), name=call.name, arguments=call.arguments, error=call.error)
                 for item_id, call in zip(item_ids, calls))


@dataclass(slots=True)
class TrajectoryWriter:
    """What every transcript holds: the trajectory it writes, its token budget and item ids, and the items of
    model turns, answers and inputs."""

    trajectory: Trajectory
    max_tokens: int
    """Model and environment tokens after the prompt, over all turns (`Limits.max_completion_tokens`)."""
    item_ids: ItemIds

    @property
    def budget_left(self) -> int:
        return self.max_tokens - self.trajectory.tokens_spent

    def number(self, turn: Turn, *, call_prefix: str = "call") -> TurnItemIds:
        """The ids of `turn`'s items, drawn in item order: its reasoning (when it has some), its message (when it has
        text or calls nothing), one per call (starting with `call_prefix`)."""
        next_id = self.item_ids
        return TurnItemIds(reasoning=next_id("rs") if turn.reasoning else "",
                           message=next_id("msg") if turn.text or not turn.calls else "",
                           calls=[next_id(call_prefix) for _ in turn.calls])

    def add_turn(self, turn: Turn, ids: TurnItemIds) -> None:
        """Count `turn`'s parse errors and append its items (`gym_bridge.core.items.turn_items`) with the ids `number`
        drew for it."""
        trajectory = self.trajectory
        if turn.calls:
            trajectory.parse_errors += turn.parse_errors
        elif turn.unparsed_tool_call:
            trajectory.unparsed_tool_calls += 1
        trajectory.output.extend(turn_items(turn, reasoning_id=ids.reasoning, message_id=ids.message, call_item_ids=ids.calls))

    def add_user_item(self, content: str) -> None:
        self.trajectory.output.append(user_message_item(content, item_id=self.item_ids("msg")))

    def add_answer(self, turn: Turn) -> None:
        """The items of a turn a chat endpoint answered (the capture sessions), its calls named as answered:
        reasoning, message and one `fc` item per call, the last item carrying the call's token fields."""
        self.add_turn(turn, self.number(turn, call_prefix="fc"))

    def add_inputs(self, messages: Sequence[Mapping[str, Any]]) -> None:
        """The items of messages a client added to the conversation: a tool message is a `function_call_output`,
        a user message a `message`; other roles have none."""
        for message in messages:
            if message["role"] == "tool":
                self.trajectory.output.append(function_call_output_item(message["content"], call_id=message.get("tool_call_id", "")))
            elif message["role"] == "user":
                self.add_user_item(message["content"])


def _writer(trajectory: Trajectory, *, session_id: str, max_tokens: int, numbering: ItemIds | None) -> TrajectoryWriter:
    """A transcript's writer; its items numbered by `numbering` (default: a numbering of its own, labelled `session_id`)."""
    return TrajectoryWriter(trajectory=trajectory, max_tokens=max_tokens, item_ids=ItemIds(session_id) if numbering is None else numbering)


class TokenTranscript:
    """The append-only token stream of a token policy; the template renders what the environment adds."""

    __slots__ = ("policy", "template", "tools", "session_id", "writer", "last_token")

    def __init__(self, policy: Policy, template: ChatTemplate, *, task: Task | None, tools: tuple[dict[str, Any], ...],
                 trajectory: Trajectory, session_id: str, max_tokens: int, numbering: ItemIds | None = None) -> None:
        """`task`: its messages render the prompt; None: `trajectory` holds it already."""
        self.policy, self.template, self.tools, self.session_id = policy, template, tools, session_id
        self.writer = _writer(trajectory, session_id=session_id, max_tokens=max_tokens, numbering=numbering)
        self.last_token: int | None = None
        """The end-of-turn token the model sampled last, whose closing the next delta must not repeat."""
        if task is not None:
            trajectory.prompt_ids = template.prompt_ids(task_template_messages(task.messages), tools or None)

    @property
    def trajectory(self) -> Trajectory:
        return self.writer.trajectory

    async def sample(self, sampling: SamplingParams) -> tuple[Generation, list[int]]:
        """One model call on everything so far, its tokens appended; returns it and the prompt ids it was given."""
        trajectory = self.writer.trajectory
        prompt_ids = trajectory.context_ids()
        generation = await self.policy.generate(GenerationRequest(prompt_ids=prompt_ids, sampling=sampling, session_id=self.session_id))
        trajectory.append_model(generation.token_ids, generation.logprobs)
        return generation, prompt_ids

    async def generate(self, sampling: SamplingParams) -> Turn:
        generation, prompt_ids = await self.sample(sampling)
        parsed, _, self.last_token = read_turn(self.template, generation.token_ids, text=generation.text, prompt_ids=prompt_ids,
                                               tools=self.tools)
        if generation.policy_version is not None:
            self.writer.trajectory.policy_versions.append(generation.policy_version)
        ids = self.writer.number(parsed)
        turn = sampled_turn(parsed, generation, prompt_ids, calls=named_calls(parsed.calls, ids.calls, self._call_id))
        self.writer.add_turn(turn, ids)
        return turn

    def _call_id(self, item_id: str, call: ToolCall) -> str:
        # the id the template renders for the model (Mistral: nine letters and digits), so records and prompts agree
        return self.template.call_id(item_id.removeprefix("call_"), written=call.id)

    async def append_tool_outputs(self, outputs: Sequence[ToolOutput]) -> bool:
        template, last_token = self.template, self.last_token
        if sum(len(out.content) for out in outputs) < OFF_LOOP_TOKENIZE_CHARS:
            return self._append_env(template.tool_delta_ids(outputs, last_token_id=last_token))
        delta: list[int] = await call_bounded(lambda: template.tool_delta_ids(outputs, last_token_id=last_token),
                                              timeout_s=TOKENIZE_TIMEOUT_S, owner="tokenizer")
        return self._append_env(delta)

    async def append_user_message(self, content: str) -> bool:
        template, last_token = self.template, self.last_token
        if len(content) < OFF_LOOP_TOKENIZE_CHARS:
            delta = template.user_delta_ids(content, last_token_id=last_token)
        else:
            delta = await call_bounded(lambda: template.user_delta_ids(content, last_token_id=last_token),
                                       timeout_s=TOKENIZE_TIMEOUT_S, owner="tokenizer")
        if not self._append_env(delta):
            return False
        self.writer.add_user_item(content)
        return True

    def _append_env(self, delta: list[int]) -> bool:
        if len(delta) >= self.writer.budget_left:
            return False
        self.writer.trajectory.append_env(delta)
        return True

    def finish(self) -> TokenView:
        return self.writer.trajectory.tokens()


class ServedTranscript:
    """The token transcript of a client that sends the whole conversation with every call (the capture
    endpoint): it keeps the messages as rendered beside its token stream (`tokens`), so a call that only adds
    tool or user messages to them extends that stream (`extension`, `extended`: the sampled tokens are never
    re-tokenized), and any other call (a rewritten history) starts a new one (`start`)."""

    __slots__ = ("tokens", "messages")

    def __init__(self, tokens: TokenTranscript, messages: list[TemplateMessage]) -> None:
        self.tokens, self.messages = tokens, messages

    @classmethod
    async def start(cls, policy: Policy, template: ChatTemplate, *, messages: list[TemplateMessage], tools: tuple[dict[str, Any], ...],
                    session_id: str, max_tokens: int, numbering: ItemIds, output: list[Item]) -> ServedTranscript:
        """A conversation rendered whole from `messages` (in a worker thread when long), its items going to `output`.
        Raises what the chat template raises, TimeoutError when tokenizing outlasts `TOKENIZE_TIMEOUT_S`."""
        prompt_ids = await _tokenized(lambda: template.prompt_ids(messages, list(tools) or None), messages, tools)
        tokens = TokenTranscript(policy, template, task=None, tools=tools, trajectory=Trajectory(prompt_ids=prompt_ids, output=output),
                                 session_id=session_id, max_tokens=max_tokens, numbering=numbering)
        return cls(tokens, messages)

    def extension(self, messages: Sequence[TemplateMessage], tools: tuple[dict[str, Any], ...]) -> list[TemplateMessage] | None:
        """The messages a call adds when it extends this conversation (same tools) with tool or user messages only; else None."""
        new = appended(self.messages, messages) if tools == self.tokens.tools else None
        return new if new and all(message["role"] in ("tool", "user") for message in new) else None

    async def extended(self, new: list[TemplateMessage]) -> ServedTranscript:
        """A copy that goes on with `new` (from `extension`): their rendering appended after the sampled tokens
        (environment tokens; in a worker thread when long) and their items added. A copy, so calls made at once
        each extend the conversation they were sent."""
        tokens = self.tokens
        template, trajectory, writer = tokens.template, tokens.trajectory, tokens.writer
        closing = template.closing_text(tokens.last_token)
        delta = await _tokenized(lambda: template.encode(template.delta_text(new, closing_sampled=closing)), new)
        copy = Trajectory(prompt_ids=trajectory.prompt_ids, completion_ids=list(trajectory.completion_ids),
                          completion_mask=list(trajectory.completion_mask), completion_logprobs=list(trajectory.completion_logprobs),
                          output=trajectory.output)
        copy.append_env(delta)
        extended = TokenTranscript(tokens.policy, template, task=None, tools=tokens.tools, trajectory=copy, session_id=tokens.session_id,
                                   max_tokens=writer.max_tokens, numbering=writer.item_ids)
        extended.last_token = tokens.last_token
        extended.writer.add_inputs(new)
        return ServedTranscript(extended, self.messages + new)

    def sample(self, sampling: SamplingParams) -> Awaitable[tuple[Generation, list[int]]]:
        """One model call on the conversation's tokens (`TokenTranscript.sample`)."""
        return self.tokens.sample(sampling)

    def answer(self, generation: Generation, prompt_ids: list[int], *, number: int) -> AssistantMessage:
        """The assistant message answering the call `sample` made (the `answer_turn` rule, its calls named
        `<number>x<n>`): its items added, the last with the call's tokens, and the conversation extended by it
        as the client sends it back."""
        tokens = self.tokens
        template = tokens.template
        parsed, text, tokens.last_token = read_turn(template, generation.token_ids, text=None, prompt_ids=prompt_ids, tools=tokens.tools)
        answered = answer_turn(parsed, text, tools_offered=bool(tokens.tools),
                               call_id=lambda n, call: template.call_id(f"{number}x{n}", written=call.id))
        tokens.writer.add_answer(sampled_turn(answered, generation, prompt_ids))
        message = assistant_message(answered)
        self.messages = self.messages + template_messages([MessageIn.model_validate(message)], tool_format=template.tool_format)
        return message

    def finish(self) -> TokenView:
        return self.tokens.finish()


class MessageTranscript:
    """The chat messages of a chat policy; the token stream only from ids the server returns."""

    __slots__ = ("policy", "tools", "session_id", "writer", "messages")

    def __init__(self, policy: ChatPolicy, *, task: Task | None, tools: tuple[dict[str, Any], ...],
                 trajectory: Trajectory, session_id: str, max_tokens: int, numbering: ItemIds | None = None) -> None:
        """`task`: the conversation starts with its messages; None: with none (a client sends them with each call)."""
        self.policy, self.tools, self.session_id = policy, tools, session_id
        self.writer = _writer(trajectory, session_id=session_id, max_tokens=max_tokens, numbering=numbering)
        self.messages: list[Message] = list(task.messages) if task is not None else []

    @property
    def trajectory(self) -> Trajectory:
        return self.writer.trajectory

    async def generate(self, sampling: SamplingParams) -> Turn:
        """One call of the chat policy: items and an assistant message, plus the call's tokens when the server
        returned them (carried on the last item and on the assistant message, which goes back to the server so it
        keeps the prompt's prefix exact)."""
        request = ChatRequest(messages=list(self.messages), tools=self.tools, sampling=sampling, session_id=self.session_id)
        answer = await self.policy.chat(request)
        if answer.tokens is None:
            self.trajectory.append_model([], [])
            self.trajectory.add_api_usage(dict(answer.usage))
        else:
            self._append_call_tokens(answer.tokens)
        parsed = _read_chat_turn(answer)
        ids = self.writer.number(parsed)
        turn = replace(parsed, calls=named_calls(parsed.calls, ids.calls, _item_id)) if parsed.calls else parsed
        self.writer.add_turn(turn, ids)
        self.messages.append(assistant_message(turn))
        return turn

    def _append_call_tokens(self, tokens: CallTokens) -> None:
        """Grow the token stream from a chat call's ids: its prompt must start with everything seen
        so far; what follows is environment tokens (the server's rendering of the new messages)."""
        trajectory = self.trajectory
        if trajectory.model_calls and (not trajectory.prompt_ids or not self.continues(tokens)):
            seen, prompt = trajectory.context_ids(), tokens.prompt_token_ids
            at = first_difference(seen, prompt)
            raise FailRollout(
                "infra",
                f"the model server's prompt token ids for call {trajectory.model_calls + 1} do not start with the "
                f"{len(seen)} tokens of the earlier calls (first difference at position {at}); the server must keep "
                "the prefix exact from the token ids sent back on the assistant messages",
            )
        self.add_call_tokens(tokens)

    def continues(self, tokens: CallTokens) -> bool:
        """Whether a chat call's prompt ids start with every token so far (the prefix rule on a server's ids)."""
        return extends(self.trajectory.context_ids(), tokens.prompt_token_ids)

    def add_call_tokens(self, tokens: CallTokens) -> None:
        """Grow the token stream by a chat call's ids (the first call's prompt is the stream's prompt); call
        `continues` first: what its prompt adds to the stream becomes environment tokens."""
        trajectory = self.trajectory
        prompt = list(tokens.prompt_token_ids)
        if trajectory.model_calls == 0:
            trajectory.prompt_ids = prompt
        else:
            trajectory.append_env(prompt[len(trajectory.prompt_ids) + len(trajectory.completion_ids):])
        trajectory.append_model(list(tokens.generation_token_ids), list(tokens.generation_log_probs))

    async def append_tool_outputs(self, outputs: Sequence[ToolOutput]) -> bool:
        self.messages.extend(tool_message(out.call_id, out.content, name=out.name) for out in outputs)
        return True

    async def append_user_message(self, content: str) -> bool:
        self.messages.append({"role": "user", "content": content})
        self.writer.add_user_item(content)
        return True

    def finish(self) -> TokenView:
        return self.writer.trajectory.tokens()


def read_turn(template: ChatTemplate, ids: Sequence[int], *, text: str | None, prompt_ids: Sequence[int],
              tools: Sequence[dict[str, Any]]) -> tuple[Turn, str, int | None]:
    """A sampled turn read with the model family's parsers: the parsed turn, its text (`text` as the
    backend decoded it, else decoded here; without the end-of-turn token either way), and the
    end-of-turn token it ended on (None when it did not end on one)."""
    last_token = ids[-1] if ids and ids[-1] in template.eos_token_ids else None
    if text is None:
        text = template.decode(ids[:-1] if last_token is not None else ids)
    elif last_token is not None:
        text = text.removesuffix(template.closing_text(last_token))
    return template.parse(text, prompt_ids=prompt_ids, tools=tools), text, last_token


def answer_turn(parsed: Turn, text: str, *, tools_offered: bool, call_id: Callable[[int, ToolCall], str]) -> Turn:
    """The turn a chat server answers for a sampled turn (`text`, read by `read_turn` into `parsed`), the one
    rule of serve-model and the capture endpoint: text and reasoning apart, and each call named `call_id(n, call)`.
    With no tools offered, call-shaped text is the answer's text; a turn whose calls do not all parse is answered
    as written (as vLLM's tool parsers do)."""
    if not tools_offered and parsed.calls:
        return Turn(reasoning=parsed.reasoning, text=parsed.text or text)
    if any(call.error is not None for call in parsed.calls):
        return Turn(text=text)
    return replace(parsed, calls=tuple(replace(call, id=call_id(n, call)) for n, call in enumerate(parsed.calls)))


def sampled_turn(parsed: Turn, generation: Generation, prompt_ids: list[int], *, calls: tuple[ToolCall, ...] | None = None) -> Turn:
    """A token policy's turn, made in one step: what its parsers read (`parsed`), its calls as named in the record
    (`calls`; None: the parsed ones as they are), and the call's token ids, finish reason and policy version
    (`generation`, sampled after `prompt_ids`)."""
    return Turn(reasoning=parsed.reasoning, text=parsed.text, calls=parsed.calls if calls is None else calls,
                tokens=CallTokens(prompt_ids, list(generation.token_ids), list(generation.logprobs)),
                finish_reason=generation.finish_reason, policy_version=generation.policy_version,
                unparsed_tool_call=parsed.unparsed_tool_call, usage=parsed.usage)


class StartTranscript(Protocol):
    """Starts the transcript of one rollout (for a token policy: renders the prompt)."""

    def __call__(self, *, task: Task, tools: tuple[dict[str, Any], ...], trajectory: Trajectory, session_id: str,
                 max_tokens: int) -> Transcript: ...


def transcript_starter(policy: Policy | ChatPolicy, template: ChatTemplate | None) -> StartTranscript:
    """How every rollout of `policy` starts its transcript: tokens for a token policy (which needs
    `template`), messages for a chat policy. Raises TypeError for an object that is neither."""
    def tokens(token_policy: Policy) -> StartTranscript:
        if template is None:
            raise ValueError("a token-in/token-out policy needs a ChatTemplate")
        token_template = template

        def start_tokens(*, task: Task, tools: tuple[dict[str, Any], ...], trajectory: Trajectory, session_id: str,
                         max_tokens: int) -> Transcript:
            return TokenTranscript(token_policy, token_template, task=task, tools=tools, trajectory=trajectory,
                                   session_id=session_id, max_tokens=max_tokens)
        return start_tokens

    def messages(chat_policy: ChatPolicy) -> StartTranscript:
        def start_messages(*, task: Task, tools: tuple[dict[str, Any], ...], trajectory: Trajectory, session_id: str,
                           max_tokens: int) -> Transcript:
            return MessageTranscript(chat_policy, task=task, tools=tools, trajectory=trajectory, session_id=session_id,
                                     max_tokens=max_tokens)
        return start_messages

    return by_policy_kind(policy, token=tokens, chat=messages)


def _item_id(item_id: str, call: ToolCall) -> str:
    """A chat policy's call is named by its item (the API's own id is not kept)."""
    return item_id


async def _tokenized(render: Callable[[], list[int]], *rendered: Sequence[Mapping[str, Any]]) -> list[int]:
    """`render()`, in a worker thread when what it renders (`rendered`: messages, tool schemas) holds
    `OFF_LOOP_TOKENIZE_CHARS` characters or more (as the engine tokenizes long tool outputs): a megabyte
    of messages or of tools stalled every rollout's calls for seconds."""
    if not _at_least_chars(rendered, OFF_LOOP_TOKENIZE_CHARS):
        return render()
    ids: list[int] = await call_bounded(render, timeout_s=TOKENIZE_TIMEOUT_S, owner="tokenizer")
    return ids


def _at_least_chars(value: Any, limit: int) -> bool:
    """Whether the strings of `value` (keys included; nested dicts and lists, every other leaf counted as one
    character) add up to `limit` or more. Stops once they do, so a big value costs about `limit` steps."""
    total, stack = 0, [value]
    while stack and total < limit:
        item = stack.pop()
        if isinstance(item, str):
            total += max(len(item), 1)
        elif isinstance(item, Mapping):
            total += 1
            stack.extend(islice(chain.from_iterable(item.items()), limit - total))
        elif isinstance(item, (list, tuple)):
            total += 1
            stack.extend(islice(item, limit - total))
        else:
            total += 1
    return total >= limit


def _read_chat_turn(answer: Turn) -> Turn:
    """A chat API's turn as the loop sees it (its tokens, finish reason and usage kept); tool calls written as
    text (a server without a tool parser) are parsed like a token policy's."""
    if not answer.calls:
        parsed = parse_turn(answer.text)
        return replace(answer, reasoning=answer.reasoning or parsed.reasoning, text=parsed.text, calls=parsed.calls,
                       unparsed_tool_call=parsed.unparsed_tool_call)
    calls = []
    for call in answer.calls:
        try:
            arguments = json.loads(call.arguments) if call.arguments.strip() else {}
        except json.JSONDecodeError:
            calls.append(ToolCall(name=call.name, arguments=call.arguments, error="'arguments' is not valid JSON"))
            continue
        if not isinstance(arguments, dict):
            calls.append(ToolCall(name=call.name, arguments=call.arguments, error="'arguments' must be a JSON object"))
        else:
            calls.append(ToolCall(name=call.name, arguments=json.dumps(arguments)))
    return replace(answer, text=answer.text.strip(), calls=tuple(calls))
