"""Tool-call and reasoning parsers per model family, named as vLLM names them.

`TOOL_PARSERS` and `REASONING_PARSERS` map names to parsers; `TurnParser` applies one of each
to a sampled turn. `tool_parser_candidates` and `reasoning_parser_for` pick them from a chat
template's text (the template profile confirms the pick by parsing the template's own
rendering of a call); users override with `tool_parser=` / `reasoning_parser=`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Protocol, Sequence

from gym_bridge.core.errors import UnknownParserError
from gym_bridge.core.template.parsers.call import CALL_MARKERS, ToolParser, looks_like_call
from gym_bridge.core.template.parsers.deepseek import DeepSeekParser
from gym_bridge.core.template.parsers.harmony import HarmonyReasoningParser, HarmonyToolParser
from gym_bridge.core.template.parsers.hermes import HermesParser
from gym_bridge.core.template.parsers.json_list import JsonListParser
from gym_bridge.core.template.parsers.llama3 import Llama3JsonParser
from gym_bridge.core.template.parsers.mistral import MistralParser
from gym_bridge.core.template.parsers.qwen3_coder import Qwen3CoderParser
from gym_bridge.core.template.parsers.think import ThinkParser
from gym_bridge.core.turn import ToolCall, Turn

__all__ = [
    "CALL_MARKERS", "REASONING_PARSERS", "TOOL_PARSERS", "ToolCall", "Turn", "ReasoningParser", "ToolParser",
    "TurnParser", "get_reasoning_parser", "get_tool_parser", "reasoning_parser_for", "tool_parser_candidates",
]


class ReasoningParser(Protocol):
    @property
    def name(self) -> str:
        """The parser's name, as vLLM names it."""
        ...

    @property
    def opener(self) -> str | None:
        """What a generation prompt ends with when it opens the reasoning block itself (None: never)."""
        ...

    def split(self, text: str, *, opened: bool = False) -> tuple[str, str]:
        """(reasoning, the rest of the turn)."""
        ...

    def format(self, reasoning: str, *, opened: bool = False) -> str:
        """Reasoning written as the model writes it, before its answer or calls."""
        ...


TOOL_PARSERS: dict[str, ToolParser] = {
    "hermes": HermesParser(),
    "llama3_json": Llama3JsonParser(),
    "mistral": MistralParser(),
    "deepseek_v3": DeepSeekParser("deepseek_v3"),
    "deepseek_v31": DeepSeekParser("deepseek_v31"),
    "granite": JsonListParser("granite", "<|tool_call|>", text_marker="<tool_call>"),
    "phi4_mini_json": JsonListParser("phi4_mini_json", "functools[", list_in_marker=True, require_arguments=True),
    "openai": HarmonyToolParser(),
    "qwen3_coder": Qwen3CoderParser(),
}
REASONING_PARSERS: dict[str, ReasoningParser | None] = {
    "qwen3": ThinkParser("qwen3", ends_at=("<tool_call>",)),
    "deepseek_r1": ThinkParser("deepseek_r1"),
    "openai_gptoss": HarmonyReasoningParser(),
    "none": None,
}


def get_tool_parser(name: str) -> ToolParser:
    """The tool parser called `name`; raises UnknownParserError listing the known names."""
    parser = TOOL_PARSERS.get(name)
    if parser is None:
        raise UnknownParserError(f"unknown tool parser {name!r}; known tool parsers: {', '.join(TOOL_PARSERS)}")
    return parser


def get_reasoning_parser(name: str) -> ReasoningParser | None:
    """The reasoning parser called `name` (None for `none`); raises UnknownParserError listing the known names."""
    if name not in REASONING_PARSERS:
        raise UnknownParserError(f"unknown reasoning parser {name!r}; known reasoning parsers: {', '.join(REASONING_PARSERS)}")
    return REASONING_PARSERS[name]


def tool_parser_candidates(template_text: str) -> list[str]:
    """Tool parsers that fit a chat template's text, best first (`hermes` for templates without
    tool support: gym_bridge then teaches the Hermes syntax in the system message)."""
    if "<|channel|>" in template_text and "to=" in template_text:
        return ["openai"]
    if "[TOOL_CALLS]" in template_text:
        return ["mistral"]
    if "tool\u2581call\u2581begin" in template_text:
        return ["deepseek_v3", "deepseek_v31"] if "```json" in template_text else ["deepseek_v31", "deepseek_v3"]
    if "<|tool_call|>" in template_text:
        return ["granite"]
    if "functools" in template_text:
        return ["phi4_mini_json"]
    if "<function=" in template_text and "<parameter=" in template_text:
        return ["qwen3_coder"]
    if "<tool_call>" in template_text:
        return ["hermes"]
    if "<|python_tag|>" in template_text or "ipython" in template_text or '"parameters": ' in template_text:
        return ["llama3_json"]
    return ["hermes"]


def reasoning_parser_for(template_text: str, *, generation_prompt: str) -> str:
    """The reasoning parser for a chat template: harmony's analysis channel, a think block the
    prompt opens (`deepseek_r1`), one the model opens (`qwen3`), or `none`."""
    if "<|channel|>" in template_text and "analysis" in template_text:
        return "openai_gptoss"
    if generation_prompt.rstrip().endswith("<think>"):
        return "deepseek_r1"
    if "<think>" in template_text or "</think>" in template_text:
        return "qwen3"
    return "none"


@dataclass(frozen=True)
class TurnParser:
    """A reasoning parser (optional) and a tool parser, applied to one sampled turn."""

    tool: ToolParser
    reasoning: ReasoningParser | None = None

    def parse(self, text: str, *, opened: bool = False, tools: Sequence[Mapping[str, Any]] = ()) -> Turn:
        """Reasoning, content and calls of `text` (special tokens kept, end-of-turn token removed).
        `opened`: the prompt ended inside a reasoning block."""
        reasoning, rest = ("", text) if self.reasoning is None else self.reasoning.split(text, opened=opened)
        turn = self.tool.parse(rest, tools)
        if reasoning:
            turn = replace(turn, reasoning=f"{reasoning}\n{turn.reasoning}" if turn.reasoning else reasoning)
        written_in_reasoning = any(marker in reasoning for marker in self.tool.markers)  # deepseek_r1 keeps such a call there
        if not turn.calls and ((turn.text and looks_like_call(turn.text)) or written_in_reasoning):
            turn = replace(turn, unparsed_tool_call=True)
        return turn

    def format(self, calls: Sequence[ToolCall], *, reasoning: str = "", content: str = "", opened: bool = False) -> str:
        """A turn as this family writes it: reasoning, content, then the calls."""
        head = self.reasoning.format(reasoning, opened=opened) if reasoning and self.reasoning is not None else ""
        body = self.tool.format(calls) if calls else ""
        return head + content + body
