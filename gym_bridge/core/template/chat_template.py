"""Chat templating for token-in/token-out rollouts: `ChatTemplate`.

The first prompt is rendered once; after that the stream only grows by sampled ids and environment
deltas, each rendered once per shape on a probe and then filled in by string joins. Earlier turns
reach the template as a chat server would give them (see `template_profile`), `tools` on every
render; every template failure is a `TemplateError`. Layer: above `render`, `profile`, `codec`,
`delta` and `messages` (`Tokenizer`, `ToolOutput` import from `codec`, `messages`); `check`
(above it) says where streaming is append-only.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Mapping, Sequence, get_args

import orjson

from gym_bridge.core.conversation import TemplateMessage
from gym_bridge.core.dialects.template_view import to_template_tool
from gym_bridge.core.errors import TemplateError
from gym_bridge.core.template.codec import TokenCodec, Tokenizer, special_tokens
from gym_bridge.core.template.delta import DeltaPlanner
from gym_bridge.core.template.messages import ToolOutput, conversation, tool_messages
from gym_bridge.core.template.parsers import get_reasoning_parser, get_tool_parser, tool_parser_candidates
from gym_bridge.core.template.profile import PROBE_USER, TemplateProfile, build_profile, is_short_id, short_call_id, template_message
from gym_bridge.core.template.render import prepared_messages, render_chat
from gym_bridge.core.turn import ToolCall, Turn

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

_UNSET: Any = object()


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
        self._profile: TemplateProfile | None = None
        self._empty_tools: Any = _UNSET
        self._direct: Any = _UNSET
        self._direct_variables: dict[str, Any] = {}
        self.codec = TokenCodec(tokenizer)
        """Text to ids and back (`encode`, `decode`)."""
        self.deltas = DeltaPlanner(self)
        """The environment deltas, each shape planned once (`delta_text`)."""

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
            if isinstance(template, str) and special_tokens(self.tokenizer) and not set(self.chat_template_kwargs) & _APPLY_ARGUMENTS:
                tool = to_template_tool({"name": "probe_tool", "description": "A probe.", "parameters": {
                    "type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}})
                variables = {**special_tokens(self.tokenizer), **self.chat_template_kwargs}
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
        """`messages` (chat messages; assistant turns as `template_message` builds them) rendered by
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
            example = ToolCall(name="<function name>", arguments='{"<argument>": "<value>"}')
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

    def parse(self, text: str, *, prompt_ids: Sequence[int], tools: Sequence[Mapping[str, Any]] = ()) -> Turn:
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

    def template_message(self, turn: Turn, *, call_ids: Sequence[str], raw_text: str) -> TemplateMessage:
        """A sampled turn as the assistant message a chat server would give this template (`profile.template_message`)."""
        return template_message(self.profile.style, turn, call_ids=call_ids, raw_text=raw_text)

    def conversation(self, output: Sequence[Mapping[str, Any]]) -> list[TemplateMessage]:
        """A trajectory's items (a record's `response.output`) as the chat messages this template is
        given (`gym_bridge.core.template.messages.conversation`). For an append-only template,
        rendering the task's messages plus these with a generation prompt gives the next call's prompt."""
        return conversation(self, output)

    # -- deltas ------------------------------------------------------------------------------

    def conversation_ids(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[dict[str, Any]] | None, *,
                         add_generation_prompt: bool) -> list[int]:
        """Token ids of a whole conversation as the chat template renders it, tools included as in
        `prompt_ids` (servers that re-render a conversation each call use this)."""
        return self.encode(self.render(self._with_tool_system(messages, tools), tools=tools, add_generation_prompt=add_generation_prompt))

    def tool_messages(self, outputs: Sequence[ToolOutput]) -> list[TemplateMessage]:
        return tool_messages(outputs)

    def delta_text(self, new_messages: Sequence[Mapping[str, Any]], *, closing_sampled: str) -> str:
        """The text to append after a sampled turn for `new_messages` (tool or user messages):
        the rest of the turn's closing, the messages and the next generation prompt (see `gym_bridge.core.template.delta`)."""
        return self.deltas.text(new_messages, closing_sampled=closing_sampled)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` without special tokens added (`TokenCodec.encode`)."""
        return self.codec.encode(text)

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of `token_ids`, special tokens kept (as `tokenizer.decode(..., skip_special_tokens=False)`)."""
        return self.codec.decode(token_ids)

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
