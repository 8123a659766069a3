"""Reasoning in a `<think>...</think>` block at the start of a turn (vLLM's `qwen3` and `deepseek_r1`
reasoning parsers). The block may be opened by the model or already by the generation prompt
(QwQ, DeepSeek-R1). Text before `</think>` is reasoning either way; a turn whose prompt opened the
block and that never closes it is all reasoning (the model never answered). As in vLLM, `qwen3`
also ends the block at a `<tool_call>` written inside it (the call is read, a later `</think>`
dropped); `deepseek_r1` keeps such a call in the reasoning, where the turn parser flags it.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


class ThinkParser:
    opener = OPEN

    def __init__(self, name: str, *, ends_at: tuple[str, ...] = ()) -> None:
        self.name = name
        self.ends_at = ends_at
        """Tool-call openers that end an open block (the call they open is no reasoning)."""

    def split(self, text: str, *, opened: bool = False) -> tuple[str, str]:
        """(reasoning, rest) of a turn; `opened`: the prompt ended inside a think block."""
        close = text.find(CLOSE)
        if not (opened or text.lstrip().startswith(OPEN) or (close >= 0 and OPEN not in text)):
            return "", text
        call = self._call_at(text)
        if call >= 0 and (close < 0 or call < close):
            return _reasoning(text[:call]), text[call:].replace(CLOSE, "", 1).strip()
        if close >= 0:
            return _reasoning(text[:close]), text[close + len(CLOSE):].strip()
        return _reasoning(text), ""

    def _call_at(self, text: str) -> int:
        found = [at for at in (text.find(marker) for marker in self.ends_at) if at >= 0]
        return min(found, default=-1)

    def format(self, reasoning: str, *, opened: bool = False) -> str:
        """The block as these models write it (after the prompt's `<think>` when `opened`)."""
        return f"{reasoning}\n{CLOSE}\n\n" if opened else f"{OPEN}\n{reasoning}\n{CLOSE}\n\n"


def _reasoning(text: str) -> str:
    return text.strip().removeprefix(OPEN).strip()
