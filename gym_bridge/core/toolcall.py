"""The default turn parser, for text whose model family is not known (chat APIs that return calls
as text): a `<think>` block is split off, then the turn is read as Hermes/Qwen
`<tool_call>` calls or, failing that, as Llama 3 / plain JSON (call objects anywhere in the turn,
one or a list of them, optionally after `<|python_tag|>` or in a ```json fence). Token rollouts use the
family's own parser instead (`gym_bridge.core.template.parsers`), and so do serve-model and the capture endpoint.
"""

from __future__ import annotations

from gym_bridge.core.template.parsers import REASONING_PARSERS, TOOL_PARSERS, TurnParser
from gym_bridge.core.turn import Turn

__all__ = ["parse_turn"]

_HERMES = TurnParser(tool=TOOL_PARSERS["hermes"], reasoning=REASONING_PARSERS["qwen3"])
_JSON = TurnParser(tool=TOOL_PARSERS["llama3_json"], reasoning=REASONING_PARSERS["qwen3"])


def parse_turn(text: str) -> Turn:
    """Split one model turn (special tokens removed) into reasoning, content and tool calls."""
    return (_HERMES if "<tool_call>" in text else _JSON).parse(text)
