"""Chat templating for token-in/token-out rollouts: `ChatTemplate`.

The first prompt is rendered once; after that the stream only grows by sampled ids and environment
deltas, each rendered once per shape on a probe and then filled in by string joins. Earlier turns
reach the template as a chat server would give them (see `template_profile`), `tools` on every
render; every template failure is a `TemplateError`. Layer: above `chat_render` and
`template_profile`; `template_check` (above it) says where streaming is append-only.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping, Protocol, Sequence, get_args

import orjson

from gym_bridge.core.template.render import prepared_messages, render_chat
from gym_bridge.core.dialects.responses import item_text
from gym_bridge.core.dialects.template_view import to_template_tool
from gym_bridge.core.errors import TemplateError
from gym_bridge.core.conversation import TemplateMessage
from gym_bridge.core.template.piece_encoder import PieceEncoder
from gym_bridge.core.template.parsers import get_reasoning_parser, get_tool_parser, tool_parser_candidates
from gym_bridge.core.template.parsers.call import ParsedCall, ParsedTurn
from gym_bridge.core.template.profile import (
    PROBE_TOOLS, PROBE_USER, TemplateProfile, assistant_message, build_profile, first_end, is_short_id, short_call_id,
)

ToolFormat = Literal["native", "hermes_system"]

HERMES_TOOL_INSTRUCTIONS = """# Tools

You can call functions to help answer the user. Their signatures, one JSON object per line:
<tools>
{tools}
</tools>

To call a function, write a JSON object with its name and arguments inside <tool_call></tool_call> tags:
<tool_call>
{{"name": "<function name>", "arguments": {{"<argument>": <value>}}}}
</tool_call>
The results come back in the next message. When you have the answer, reply without a tool call."""

TOOL_INSTRUCTIONS = """# Tools

You can call functions to help answer the user. Their signatures, one JSON object per line:
<tools>
{tools}
</tools>

To call a function, write its name and arguments in this form:
{example}
The results come back in the next message. When you have the answer, reply without a tool call."""
"""For templates without tool support whose family writes calls in another syntax than Hermes
(the example is that syntax, written by the family's tool parser)."""

_SENTINEL = "\u2063GYMBRIDGE_ASSISTANT\u2063"
_PROBE_ANSWER = "\u2063GYMBRIDGE_ANSWER\u2063"
_SAMPLES = (' {"a": [1, 2]}\n\tb ', "<x> & 'q' \u00e9\\n\n")
"""Contents that tell whether a template passes text through untouched, JSON-escaped or trimmed."""
_TRANSFORMS: tuple[Callable[[str], str] | None, ...] = (None, lambda text: json.dumps(text, ensure_ascii=False)[1:-1], str.strip)
_UNSET: Any = object()



def _special_tokens(tokenizer: Any) -> Mapping[str, Any]:
    """The tokenizer's special tokens as template variables (`bos_token`, ...); empty when it has none."""
    tokens = getattr(tokenizer, "special_tokens_map", None)
    return tokens if isinstance(tokens, Mapping) else {}


class Tokenizer(Protocol):
    """What gym_bridge needs of a (Hugging Face) tokenizer."""

    chat_template: Any
    eos_token_id: Any

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


_APPLY_ARGUMENTS = frozenset({
    "chat_template", "documents", "continue_final_message", "tokenize", "return_dict", "return_assistant_tokens_mask",
    "sanitize_control_tokens", "padding", "truncation", "max_length", "return_tensors", "tokenizer_kwargs", "tools",
    "add_generation_prompt", "conversation",
})
"""`apply_chat_template` parameters that are not template variables: with one of them in
`chat_template_kwargs`, the tokenizer renders every call."""


def _cache_key(value: Any) -> bytes:
    """A canonical serialization of JSON-like `value` (dict keys sorted; other objects by `str`)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=str)
    except TypeError:  # what orjson refuses (an integer beyond 64 bits, ...)
        return json.dumps(value, sort_keys=True, default=str).encode()


@dataclass(frozen=True)
class ToolOutput:
    """One tool result to render for the model."""

    name: str
    content: str
    call_id: str


@dataclass(frozen=True)
class _DeltaPlan:
    """How to build one delta shape: by joining fixed pieces around the messages' fields
    (`slots`: message index, field, transform), or (pieces None) by rendering every time."""

    structured: bool
    """The probe's previous turn was structured (else a plain message holding a sentinel)."""
    pieces: tuple[str, ...] | None
    slots: tuple[tuple[int, str, Callable[[str], str] | None], ...] = ()

    def join(self, messages: Sequence[Mapping[str, Any]]) -> str:
        assert self.pieces is not None
        out = [self.pieces[0]]
        for (index, name, transform), piece in zip(self.slots, self.pieces[1:]):
            value = messages[index][name]
            out.append(value if transform is None else transform(value))
            out.append(piece)
        return "".join(out)


def _describe(messages: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(m["role"] + ("(tool_calls)" if m.get("tool_calls") else "") for m in messages)


class ChatTemplate:
    """Renders prompts and environment deltas as token ids for one tokenizer, and reads the
    model's turns with the family's parsers.

    `tool_parser` / `reasoning_parser` override the parsers picked from the template (names as
    vLLM's: see `gym_bridge.core.template.parsers`); `chat_template_kwargs` go to every render (e.g.
    `{"enable_thinking": False}`). Raises TemplateError for a tokenizer without a chat template or
    without an end-of-turn token, UnknownParserError for an unknown parser name.
    """

    def __init__(
        self, tokenizer: Tokenizer, *, tool_format: ToolFormat | None = None, eos_token_ids: Sequence[int] = (),
        tool_parser: str | None = None, reasoning_parser: str | None = None, chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError("the tokenizer has no chat template; give a tokenizer with one (tokenizer.chat_template)")
        if tool_format is not None and tool_format not in get_args(ToolFormat):  # from configs, typed only as str
            raise TemplateError(f"tool_format must be one of {', '.join(get_args(ToolFormat))} (or unset), got {tool_format!r}")
        if tool_parser is not None:
            get_tool_parser(tool_parser)
        if reasoning_parser is not None:
            get_reasoning_parser(reasoning_parser)
        self.tokenizer = tokenizer
        self.template_text: str = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else json.dumps(tokenizer.chat_template)
        self.tool_format: ToolFormat = tool_format or ("native" if "tools" in self.template_text else "hermes_system")
        eos = {int(token) for token in eos_token_ids}
        if isinstance(tokenizer.eos_token_id, int):
            eos.add(tokenizer.eos_token_id)
        if not eos:
            raise TemplateError(
                "no end-of-turn token: the tokenizer has no eos_token_id and no eos_token_ids were given; pass "
                "eos_token_ids with the id of the token the model ends its turns with"
            )
        self.eos_token_ids = frozenset(eos)
        self._eos_text = {token: tokenizer.decode([token], skip_special_tokens=False) for token in self.eos_token_ids}
        self.end_texts: tuple[str, ...] = tuple(sorted({text for text in self._eos_text.values() if text}, key=len, reverse=True))
        """The texts of the end-of-turn tokens, longest first."""
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._parser_names = (tool_parser, reasoning_parser)
        self._instruction_parser = tool_parser or tool_parser_candidates(self.template_text)[0]
        self._prompt_cache: dict[bytes, list[int]] = {}
        self._tool_listings: dict[bytes, str] = {}
        self._plans: dict[tuple[tuple[str, str], ...], _DeltaPlan] = {}
        self._profile: TemplateProfile | None = None
        self._empty_tools: Any = _UNSET
        self._direct: Any = _UNSET
        self._direct_variables: dict[str, Any] = {}
        self._probe_head: str | None = None
        backend = getattr(tokenizer, "backend_tokenizer", None)  # a fast tokenizer's `tokenizers.Tokenizer`
        fast = backend is not None and hasattr(backend, "encode_batch")
        self._pieces = PieceEncoder(backend) if fast else None
        plain = not getattr(tokenizer, "clean_up_tokenization_spaces", False)
        self._decode_backend: Callable[..., str] | None = getattr(backend, "decode", None) if fast and plain else None
        """A fast tokenizer's own decode, which gives `tokenizer.decode`'s text when it cleans up no spaces (its
        Python wrapper checks every id's type first, on every model turn)."""

    def with_options(self, *, tool_parser: str | None = None, reasoning_parser: str | None = None,
                     chat_template_kwargs: Mapping[str, Any] | None = None) -> ChatTemplate:
        """A template for the same tokenizer with other parsers or template arguments (unset: kept)."""
        return ChatTemplate(
            self.tokenizer, tool_format=self.tool_format, eos_token_ids=sorted(self.eos_token_ids),
            tool_parser=tool_parser or self._parser_names[0], reasoning_parser=reasoning_parser or self._parser_names[1],
            chat_template_kwargs=self.chat_template_kwargs if chat_template_kwargs is None else chat_template_kwargs,
        )

    # -- what the template wants -----------------------------------------------------------

    @property
    def profile(self) -> TemplateProfile:
        """Parsers, turn style, end-of-turn marker; found once by rendering probes."""
        if self._profile is None:
            self._profile = build_profile(self, tool_parser=self._parser_names[0], reasoning_parser=self._parser_names[1])
        return self._profile

    @property
    def end_of_turn_id(self) -> int:
        """The id of the token that ends an assistant answer in this template (one of `eos_token_ids`;
        not simply the first id of a generation config's list)."""
        return min(token for token, text in self._eos_text.items() if text == self.profile.end_of_turn)

    # -- rendering -------------------------------------------------------------------------

    def _apply(self, conversation: Sequence[Mapping[str, Any]], kwargs: dict[str, Any]) -> str:
        direct = self._direct_template()
        if direct is not None:
            try:  # render_chat prepares the messages itself
                return render_chat(direct, conversation, tools=kwargs.get("tools"), add_generation_prompt=kwargs["add_generation_prompt"],
                                   variables=self._direct_variables)
            except Exception:  # noqa: BLE001 - the tokenizer's own rendering below raises (or answers) as before
                pass
        try:  # prepared as render_chat prepares them, so the prompt does not depend on the installed transformers
            text = self.tokenizer.apply_chat_template(prepared_messages(conversation), **self.chat_template_kwargs, **kwargs)
        except Exception as error:  # jinja's TemplateError, TypeError, UndefinedError, the template's raise_exception
            raise TemplateError(
                f"the chat template could not render the conversation [{_describe(conversation)}]: {type(error).__name__}: {error}. "
                "That is the template's requirement. gym_bridge gives each template structured assistant turns in the form "
                "its own rendering of a tool call shows (see ChatTemplate.profile); if this conversation is one the model must "
                "handle, give a template that renders it (tokenizer.chat_template) or other chat_template_kwargs"
            ) from error
        if not isinstance(text, str):
            raise TemplateError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, expected str")
        return text

    def _direct_template(self) -> str | None:
        """The template text when `render_chat` gives the tokenizer's own rendering of it (checked once,
        on probe conversations with and without tools), else None: the tokenizer renders every call."""
        if self._direct is _UNSET:
            self._direct = None
            template = self.tokenizer.chat_template
            if isinstance(template, str) and _special_tokens(self.tokenizer) and not set(self.chat_template_kwargs) & _APPLY_ARGUMENTS:
                tool = to_template_tool({"name": "probe_tool", "description": "A probe.", "parameters": {
                    "type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}})
                variables = {**_special_tokens(self.tokenizer), **self.chat_template_kwargs}
                try:
                    same = all(
                        render_chat(template, [PROBE_USER], tools=tools, add_generation_prompt=prompt, variables=variables)
                        == self.tokenizer.apply_chat_template([PROBE_USER], tokenize=False, add_generation_prompt=prompt,
                                                              **({"tools": tools} if tools else {}), **self.chat_template_kwargs)
                        for tools in (None, [tool]) for prompt in (True, False))
                except Exception:  # noqa: BLE001 - a template that needs more than the probe: the tokenizer renders
                    same = False
                self._direct = template if same else None
                self._direct_variables = variables  # the variables the check rendered with, for every render after it
        direct: str | None = self._direct
        return direct

    def _no_tools(self) -> Any:
        """What `tools` is when there are none: None, or [] for templates that iterate `tools` unconditionally."""
        if self._empty_tools is _UNSET:
            try:
                self._apply([PROBE_USER], {"tokenize": False, "add_generation_prompt": True})
                self._empty_tools = None
            except TemplateError:
                self._empty_tools = []
        return self._empty_tools

    def render(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[dict[str, Any]] | None, add_generation_prompt: bool) -> str:
        """`messages` (chat messages; assistant turns as `assistant_message` builds them) rendered by
        the template with the tool schemas `tools` (Responses function schemas). Raises TemplateError."""
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
        if self.tool_format == "native":
            kwargs["tools"] = [to_template_tool(schema) for schema in tools] if tools else self._no_tools()
        return self._apply(self._with_tool_system(messages, tools), kwargs)

    def _with_tool_system(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[dict[str, Any]] | None) -> list[Mapping[str, Any]]:
        messages = list(messages)
        if not tools or self.tool_format != "hermes_system":
            return messages
        key = _cache_key(tools)
        listing = self._tool_listings.get(key)
        if listing is None:
            listing = "\n".join(json.dumps(to_template_tool(schema)) for schema in tools)
            if len(self._tool_listings) >= 1024:
                self._tool_listings.clear()
            self._tool_listings[key] = listing
        if self._instruction_parser == "hermes":
            block = HERMES_TOOL_INSTRUCTIONS.format(tools=listing)
        else:
            example = ParsedCall(name="<function name>", arguments='{"<argument>": "<value>"}')
            block = TOOL_INSTRUCTIONS.format(tools=listing, example=get_tool_parser(self._instruction_parser).format([example]))
        if messages and messages[0]["role"] == "system":
            return [{**messages[0], "content": f"{messages[0]['content']}\n\n{block}"}, *messages[1:]]
        return [{"role": "system", "content": block}, *messages]

    def prompt_text(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[dict[str, Any]] | None) -> str:
        return self.render(messages, tools=tools, add_generation_prompt=True)

    def prompt_ids(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[dict[str, Any]] | None) -> list[int]:
        """The first prompt's token ids (tools included), cached per distinct prompt."""
        key = _cache_key([messages, tools])
        cached = self._prompt_cache.get(key)
        if cached is None:
            cached = self.encode(self.prompt_text(messages, tools))
            if len(self._prompt_cache) < 100_000:
                self._prompt_cache[key] = cached
        return list(cached)

    # -- model turns ------------------------------------------------------------------------

    def parse(self, text: str, *, prompt_ids: Sequence[int], tools: Sequence[Mapping[str, Any]] = ()) -> ParsedTurn:
        """Reasoning, content and tool calls of a sampled turn (`text`: special tokens kept, the
        end-of-turn token removed; `prompt_ids`: the prompt it was sampled after)."""
        profile = self.profile
        opener = profile.opener_ids
        opened = bool(opener) and len(prompt_ids) >= len(opener) and tuple(prompt_ids[-len(opener):]) == opener
        return profile.parser.parse(text, opened=opened, tools=tools)

    def call_id(self, seed: str, *, written: str | None = None) -> str:
        """The id of a tool call: `call_<seed>`, or for templates that need ids of nine letters and
        digits (Mistral) the id the model wrote if it has that form, else one derived from `seed`."""
        if self.profile.style.short_ids:
            return written if written is not None and is_short_id(written) else short_call_id(seed)
        return f"call_{seed}"

    def assistant_message(self, turn: ParsedTurn, *, call_ids: Sequence[str], raw_text: str) -> TemplateMessage:
        """A sampled turn as the assistant message a chat server would give this template."""
        return assistant_message(self.profile.style, content=turn.content, reasoning=turn.reasoning, calls=turn.calls,
                                 call_ids=call_ids, raw_text=raw_text)

    def conversation(self, output: Sequence[Mapping[str, Any]]) -> list[TemplateMessage]:
        """A trajectory's items (a record's `response.output`) as the chat messages this template is
        given: one assistant message per model call (from its items and, for templates given raw
        turns, its sampled ids), one tool message per tool output. For an append-only template,
        rendering the task's messages plus these with a generation prompt gives the next call's prompt."""
        messages: list[TemplateMessage] = []
        names: dict[str, str] = {}
        reasoning: list[str] = []
        content: list[str] = []
        calls: list[ParsedCall] = []
        for item in output:
            kind = item.get("type")
            if kind == "reasoning":
                reasoning.append(item_text(item))
            elif kind == "message":
                content.append(item_text(item))
            elif kind == "function_call":
                calls.append(ParsedCall(name=item["name"], arguments=item["arguments"], call_id=item["call_id"]))
                names[item["call_id"]] = item["name"]
            elif kind == "function_call_output":
                messages.append({"role": "tool", "name": names.get(item["call_id"], ""), "content": item["output"],
                                 "tool_call_id": item["call_id"]})
            if "generation_token_ids" in item:  # the last item of a model call
                ids = list(item["generation_token_ids"])
                raw = self.decode(ids[:-1] if ids and ids[-1] in self.eos_token_ids else ids)
                turn = ParsedTurn(reasoning="\n".join(reasoning), content="".join(content), calls=tuple(calls))
                messages.append(self.assistant_message(turn, call_ids=[call.call_id or "" for call in calls], raw_text=raw))
                reasoning, content, calls = [], [], []
        return messages

    # -- deltas ------------------------------------------------------------------------------

    def conversation_ids(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[dict[str, Any]] | None, *,
                         add_generation_prompt: bool) -> list[int]:
        """Token ids of a whole conversation as the chat template renders it, tools included as in
        `prompt_ids` (servers that re-render a conversation each call use this)."""
        return self.encode(self.render(self._with_tool_system(messages, tools), tools=tools, add_generation_prompt=add_generation_prompt))

    def tool_messages(self, outputs: Sequence[ToolOutput]) -> list[TemplateMessage]:
        return [{"role": "tool", "name": out.name, "content": out.content, "tool_call_id": out.call_id} for out in outputs]

    def _previous_turn(self, new_messages: Sequence[Mapping[str, Any]]) -> TemplateMessage:
        """The probe's assistant turn before `new_messages`: calls answered by the tool messages among them."""
        calls = [ParsedCall(name=m.get("name", ""), arguments="{}") for m in new_messages if m["role"] == "tool"]
        ids = [m.get("tool_call_id", "") for m in new_messages if m["role"] == "tool"]
        turn = ParsedTurn(reasoning="", content="" if calls else _PROBE_ANSWER, calls=tuple(calls))
        raw = self.profile.parser.format(turn.calls) if calls else _PROBE_ANSWER
        return self.assistant_message(turn, call_ids=ids, raw_text=raw)

    def _render_delta(self, new_messages: Sequence[Mapping[str, Any]], *, structured: bool) -> str:
        """The text after the previous turn's sampled text, starting with that turn's closing.

        `structured`: the previous turn is given as a chat server would give it and the delta
        starts at the first end-of-turn marker after it; else it is a plain message holding a
        sentinel and the delta starts right after the sentinel.
        """
        tools = list(PROBE_TOOLS)
        if structured:
            if self._probe_head is None:
                self._probe_head = self.render([PROBE_USER], tools=tools, add_generation_prompt=True)
            head = self._probe_head
            full = self.render([PROBE_USER, self._previous_turn(new_messages), *new_messages], tools=tools, add_generation_prompt=True)
            start = len(os.path.commonprefix([head, full]))
            end = first_end(full[start:], self.end_texts)
            if end is None:
                raise TemplateError("no end-of-turn marker after the assistant turn")
            return full[start + end[0]:]
        probe = [PROBE_USER, {"role": "assistant", "content": _SENTINEL}, *new_messages]
        text = self.render(probe, tools=tools, add_generation_prompt=True)
        return text[text.index(_SENTINEL) + len(_SENTINEL):]

    def _plan(self, new_messages: Sequence[Mapping[str, Any]]) -> _DeltaPlan:
        marks = [dict(m, content=f"\u2063GB{i}\u2063") for i, m in enumerate(new_messages)]
        for i, mark in enumerate(marks):
            if mark["role"] == "tool":
                mark["tool_call_id"] = short_call_id(f"mark{i}") if self.profile.style.short_ids else f"call_GBMARK{i}"
        structured = True
        try:
            text = self._render_delta(marks, structured=True)
            if any(m["content"] not in text for m in marks):
                raise TemplateError("a message's content is missing from the structured delta")
        except TemplateError:
            structured = False
            text = self._render_delta(marks, structured=False)  # raises TemplateError when neither works
        found: list[tuple[int, int, int, str]] = []
        for index, mark in enumerate(marks):
            for name in ("content", "tool_call_id"):
                value = mark.get(name)
                if not value or value not in text:
                    continue
                if text.count(value) != 1:
                    return _DeltaPlan(structured=structured, pieces=None)
                found.append((text.index(value), len(value), index, name))
        found.sort()
        pieces, slots, at = [], [], 0
        for position, length, index, name in found:
            pieces.append(text[at:position])
            slots.append((index, name, None))
            at = position + length
        pieces.append(text[at:])
        plan = _DeltaPlan(structured=structured, pieces=tuple(pieces), slots=tuple(slots))
        for slot_number, (index, name, _) in enumerate(slots):
            if name != "content":
                continue
            transform = self._transform(plan, marks, slot_number, index)
            if transform is _UNSET:
                return _DeltaPlan(structured=structured, pieces=None)
            slots[slot_number] = (index, name, transform)
            plan = _DeltaPlan(structured=structured, pieces=tuple(pieces), slots=tuple(slots))
        return plan

    def _transform(self, plan: _DeltaPlan, marks: list[TemplateMessage], slot_number: int, index: int) -> Any:
        """How the template writes the content of message `index` (unchanged, JSON-escaped or
        trimmed); _UNSET when it does something else."""
        candidates = list(_TRANSFORMS)
        for sample in _SAMPLES:
            trial = [dict(m, content=sample) if i == index else m for i, m in enumerate(marks)]
            rendered = self._render_delta(trial, structured=plan.structured)
            candidates = [
                transform for transform in candidates
                if _DeltaPlan(plan.structured, plan.pieces, tuple(
                    (i, n, transform if number == slot_number else t) for number, (i, n, t) in enumerate(plan.slots)
                )).join(trial) == rendered
            ]
        return candidates[0] if candidates else _UNSET

    def delta_text(self, new_messages: Sequence[Mapping[str, Any]], *, closing_sampled: str) -> str:
        """The text to append after a sampled turn for `new_messages` (tool or user messages):
        the rest of the turn's closing, the messages and the next generation prompt."""
        key = tuple((m["role"], m.get("name", "")) for m in new_messages)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._plan(new_messages)
        after = plan.join(new_messages) if plan.pieces is not None else self._render_delta(new_messages, structured=plan.structured)
        if closing_sampled and after.startswith(closing_sampled):
            after = after[len(closing_sampled):]
        return after

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` without special tokens added. With a `tokenizers` backend, the pieces
        every prompt shares (system message, tool list, markup) are tokenized once (exact: see
        `gym_bridge.core.template.piece_encoder`); long new texts go in a call that releases the GIL."""
        if self._pieces is not None:
            return self._pieces.encode(text)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of `token_ids`, special tokens kept (as `tokenizer.decode(..., skip_special_tokens=False)`)."""
        if self._decode_backend is not None:
            return self._decode_backend(list(token_ids), skip_special_tokens=False)
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)

    def closing_text(self, last_token_id: int | None) -> str:
        """The text of the end-of-turn token the model sampled last ('' if it sampled none)."""
        if last_token_id is None:
            return ""
        return self._eos_text.get(last_token_id, "")

    def tool_delta_ids(self, outputs: Sequence[ToolOutput], *, last_token_id: int | None) -> list[int]:
        """Token ids to append after a model turn that called tools: the rest of the turn's
        closing, the tool outputs and the next generation prompt."""
        return self.encode(self.delta_text(self.tool_messages(outputs), closing_sampled=self.closing_text(last_token_id)))

    def user_delta_ids(self, content: str, *, last_token_id: int | None) -> list[int]:
        """Token ids to append for a new user message (environments with a simulated user)."""
        return self.encode(self.delta_text([{"role": "user", "content": content}], closing_sampled=self.closing_text(last_token_id)))
