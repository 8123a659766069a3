"""How a chat template wants assistant turns, found once per template by rendering probes.

Owns the template profile (parsers, turn style, end-of-turn marker, reasoning opener) and the probe
turns. Templates disagree: calls as `tool_calls` or raw text, arguments as an object or JSON text,
empty content '' or None, free or nine-character call ids (Mistral), reasoning in
`reasoning_content`, `thinking` or nowhere. `build_profile` keeps the first style whose rendering of
a probe call the family's parser reads back as that call. Layer: above `chat_render`, below
`template` and `template_check`; it sees a template only as a `Renderer`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

from gym_bridge.core.errors import TemplateError
from gym_bridge.core.conversation import TemplateMessage, UserMessage
from gym_bridge.core.template.parsers import (
    ReasoningParser, TurnParser, get_reasoning_parser, get_tool_parser, reasoning_parser_for, tool_parser_candidates,
)
from gym_bridge.core.template.parsers.call import arguments_object
from gym_bridge.core.turn import ToolCall, Turn

PROBE_USER: UserMessage = {"role": "user", "content": "What is the value of a?"}
PROBE_TOOLS = ({"type": "function", "name": "lookup", "description": "Look a word up.",
                "parameters": {"type": "object", "properties": {"word": {"type": "string", "description": "The word."}},
                               "required": ["word"]}},)
PROBE_REASONING = "I should look the word up."
PROBE_ANSWER = "The value is 4."


class Renderer(Protocol):
    """What profiling needs of a chat template (`gym_bridge.core.template.chat_template.ChatTemplate` is one)."""

    template_text: str
    end_texts: tuple[str, ...]
    """The texts of the end-of-turn tokens, longest first."""

    def render(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[dict[str, Any]] | None, add_generation_prompt: bool) -> str: ...

    def encode(self, text: str) -> list[int]: ...


@dataclass(frozen=True)
class TurnStyle:
    """How assistant turns are given to the template."""

    tool_calls: bool = True
    """Calls go in `tool_calls` (False: the turn's raw text is the message's content)."""
    arguments_as_text: bool = False
    """Call arguments as a JSON string (False: as an object)."""
    none_content: bool = False
    """A turn with calls and no text has content None ('' otherwise)."""
    short_ids: bool = False
    """Call ids are nine letters and digits."""
    reasoning_field: str | None = None
    """The message field the template reads reasoning from (None: reasoning is not passed)."""

    def describe(self) -> str:
        if not self.tool_calls:
            return "raw text"
        parts = ["tool_calls", "arguments as JSON text" if self.arguments_as_text else "arguments as object"]
        if self.none_content:
            parts.append("content None")
        if self.short_ids:
            parts.append("9-character ids")
        if self.reasoning_field:
            parts.append(f"reasoning in `{self.reasoning_field}`")
        return ", ".join(parts)


@dataclass(frozen=True)
class TemplateProfile:
    tool_parser: str
    reasoning_parser: str
    parser: TurnParser
    style: TurnStyle
    end_of_turn: str
    """The text that ends an assistant answer in this template (one of the end-of-turn tokens)."""
    opener: str
    """What the generation prompt ends with when it opens reasoning itself ('' when it does not)."""
    opener_ids: tuple[int, ...]
    """The token ids of `opener` as they end an encoded prompt."""


def short_call_id(seed: str) -> str:
    """A call id of nine letters and digits, derived from `seed`."""
    number = int.from_bytes(hashlib.blake2b(seed.encode(), digest_size=8).digest(), "big")
    alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    chars = []
    for _ in range(9):
        number, digit = divmod(number, 62)
        chars.append(alphabet[digit])
    return "".join(chars)


def is_short_id(call_id: str | None) -> bool:
    return call_id is not None and len(call_id) == 9 and call_id.isascii() and call_id.isalnum()


def template_message(style: TurnStyle, turn: Turn, *, call_ids: Sequence[str], raw_text: str) -> TemplateMessage:
    """A model turn as the assistant message a chat template is given, in `style` (`raw_text`: the turn as sampled,
    without its end-of-turn token); the one converter from `Turn` to a `TemplateMessage`."""
    content, reasoning, calls = turn.text, turn.reasoning, turn.calls
    if not style.tool_calls:
        return {"role": "assistant", "content": raw_text}
    message: TemplateMessage = {"role": "assistant", "content": None if (calls and not content and style.none_content) else content}
    if calls:
        message["tool_calls"] = [
            {"id": call_id, "type": "function",
             "function": {"name": call.name, "arguments": call.arguments if style.arguments_as_text else arguments_object(call)}}
            for call, call_id in zip(calls, call_ids)
        ]
    if reasoning and style.reasoning_field:
        message[style.reasoning_field] = reasoning
    return message


def _style_candidates(reasoning_field: str | None) -> list[TurnStyle]:
    return [
        TurnStyle(arguments_as_text=text, none_content=none, short_ids=short, reasoning_field=reasoning_field)
        for none in (False, True) for text in (False, True) for short in (False, True)
    ]


def _reasoning_field(template_text: str) -> str | None:
    if "reasoning_content" in template_text:
        return "reasoning_content"
    if "message.thinking" in template_text or "message['thinking']" in template_text or '"thinking" in message' in template_text:
        return "thinking"
    return None


def probe_call(short_ids: bool, index: int = 0, word: str = "a") -> ToolCall:
    call_id = short_call_id(f"probe{index}") if short_ids else f"call_probe_{index}"
    return ToolCall(name="lookup", arguments=json.dumps({"word": word}), id=call_id)


def first_end(text: str, markers: Sequence[str]) -> tuple[int, str] | None:
    """Where the earliest of `markers` occurs in `text`, and which one."""
    found = [(at, marker) for marker in markers if marker and (at := text.find(marker)) >= 0]
    return min(found) if found else None


def canonical_turn(template: Renderer, profile: TemplateProfile, turn: Turn, *, style: TurnStyle | None = None) -> str:
    """The text a model of this family samples for `turn` after a one-user-message prompt, end-of-turn
    token included: the template's own rendering of the turn (structured styles), or the parser's
    writing of it (raw text). Raises TemplateError when the template cannot render the turn."""
    style = style or profile.style
    opened = bool(profile.opener)
    if not style.tool_calls:
        return profile.parser.format(turn.calls, reasoning=turn.reasoning, content=turn.text, opened=opened) + profile.end_of_turn
    message = template_message(style, turn, call_ids=[call.id or "" for call in turn.calls], raw_text="")
    tools = list(PROBE_TOOLS)
    head = template.render([PROBE_USER], tools=tools, add_generation_prompt=True)
    full = template.render([PROBE_USER, message], tools=tools, add_generation_prompt=False)
    if full.startswith(head):
        body = full[len(head):]
    elif opened and full.startswith(head[: -len(profile.opener)]):
        body = full[len(head) - len(profile.opener):]
    else:
        raise TemplateError("the template renders the prompt differently once an assistant turn follows it")
    end = first_end(body, template.end_texts)
    body = body[: end[0] + len(end[1])] if end else body + profile.end_of_turn
    reasoning_parser = profile.parser.reasoning
    if turn.reasoning and reasoning_parser is not None and reasoning_parser.split(body, opened=opened)[0] != turn.reasoning:
        body = reasoning_parser.format(turn.reasoning, opened=opened) + body
    return body


def strip_end(text: str, markers: Sequence[str]) -> str:
    for marker in markers:
        if marker and text.endswith(marker):
            return text[: -len(marker)]
    return text


def _same_calls(parsed: Sequence[ToolCall], expected: Sequence[ToolCall], *, short_ids: bool) -> bool:
    if len(parsed) != len(expected):
        return False
    for got, want in zip(parsed, expected):
        if got.error or got.name != want.name or arguments_object(got) != arguments_object(want):
            return False
        if short_ids and got.id is not None and got.id != want.id:
            return False
    return True


def _round_trips(template: Renderer, profile: TemplateProfile, style: TurnStyle) -> bool:
    """Whether the family's parser reads the template's rendering of a probe call turn and a probe
    answer back as the same call and answer."""
    reasoning = PROBE_REASONING if profile.parser.reasoning is not None else ""
    opened = bool(profile.opener)
    call = probe_call(style.short_ids)
    try:
        call_text = canonical_turn(template, profile, Turn(reasoning=reasoning, calls=(call,)), style=style)
        answer_text = canonical_turn(template, profile, Turn(reasoning=reasoning, text=PROBE_ANSWER), style=style)
    except TemplateError:
        return False
    parsed_call = profile.parser.parse(strip_end(call_text, template.end_texts), opened=opened, tools=PROBE_TOOLS)
    parsed_answer = profile.parser.parse(strip_end(answer_text, template.end_texts), opened=opened, tools=PROBE_TOOLS)
    return (_same_calls(parsed_call.calls, [call], short_ids=style.short_ids)
            and not parsed_answer.calls and parsed_answer.text.strip() == PROBE_ANSWER)


def _end_of_turn(template: Renderer) -> str:
    marker = "\u2063GYMBRIDGE_ANSWER\u2063"
    try:
        full = template.render([PROBE_USER, {"role": "assistant", "content": marker}], tools=list(PROBE_TOOLS), add_generation_prompt=False)
    except TemplateError:
        full = template.render([PROBE_USER, {"role": "assistant", "content": marker}], tools=None, add_generation_prompt=False)
    tail = full[full.find(marker) + len(marker):] if marker in full else ""
    end = first_end(tail, template.end_texts)
    if end is None:
        raise TemplateError(
            f"the chat template ends an assistant turn with {tail[:40]!r}, which contains none of the end-of-turn tokens "
            f"{sorted(template.end_texts)}; pass eos_token_ids with the id of the token the model ends its turns with"
        )
    return end[1]


def _opener_ids(template: Renderer, head: str, opener: str) -> tuple[int, ...]:
    if not opener:
        return ()
    ids, base = template.encode(head), template.encode(head[: -len(opener)])
    if ids[: len(base)] == base and len(ids) > len(base):
        return tuple(ids[len(base):])
    return tuple(template.encode(opener))


def build_profile(template: Renderer, *, tool_parser: str | None, reasoning_parser: str | None) -> TemplateProfile:
    """The profile of `template`: parsers (given or picked from the template), turn style, end-of-turn
    marker, reasoning opener. Raises TemplateError when no end-of-turn token ends its turns and
    UnknownParserError for an unknown parser name."""
    text = template.template_text
    head = template.render([PROBE_USER], tools=list(PROBE_TOOLS), add_generation_prompt=True)
    reasoning_name = reasoning_parser or reasoning_parser_for(text, generation_prompt=head)
    reasoning: ReasoningParser | None = get_reasoning_parser(reasoning_name)
    opener = ""
    if reasoning is not None and reasoning.opener and head.rstrip().endswith(reasoning.opener):
        opener = head[head.rfind(reasoning.opener):]
    end_of_turn = _end_of_turn(template)
    names = [tool_parser] if tool_parser else tool_parser_candidates(text)
    field = _reasoning_field(text)
    common: dict[str, Any] = {"reasoning_parser": reasoning_name, "end_of_turn": end_of_turn, "opener": opener,
                              "opener_ids": _opener_ids(template, head, opener)}
    for name in names:
        profile = TemplateProfile(tool_parser=name, parser=TurnParser(get_tool_parser(name), reasoning), style=TurnStyle(), **common)
        for style in _style_candidates(field):
            if _round_trips(template, profile, style):
                return TemplateProfile(tool_parser=name, parser=profile.parser, style=style, **common)
    # The template does not render structured calls so that the family's parser reads them back
    # (it ignores `tool_calls`, or writes them in another syntax): give it turns as sampled.
    return TemplateProfile(tool_parser=names[0], parser=TurnParser(get_tool_parser(names[0]), reasoning),
                           style=TurnStyle(tool_calls=False), **common)
