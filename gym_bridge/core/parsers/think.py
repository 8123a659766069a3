"""Reasoning in a `<think>...</think>` block at the start of a turn (vLLM's `qwen3` and `deepseek_r1`
reasoning parsers; both names give this parser). The block may be opened by the model or already by
the generation prompt (QwQ, DeepSeek-R1). Text before `</think>` is reasoning either way; a turn whose
prompt opened the block and that never closes it is all reasoning (the model never answered).
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


class ThinkParser:
    opener = OPEN

    def __init__(self, name: str) -> None:
        self.name = name

    def split(self, text: str, *, opened: bool = False) -> tuple[str, str]:
        """(reasoning, rest) of a turn; `opened`: the prompt ended inside a think block."""
        head = text.lstrip()
        starts_open = head.startswith(OPEN)
        if CLOSE in text and (opened or starts_open or OPEN not in text):
            reasoning, _, rest = text.partition(CLOSE)
            return reasoning.strip().removeprefix(OPEN).strip(), rest.strip()
        if starts_open:
            return head[len(OPEN):].strip(), ""
        if opened:
            return text.strip(), ""
        return "", text

    def format(self, reasoning: str, *, opened: bool = False) -> str:
        """The block as these models write it (after the prompt's `<think>` when `opened`)."""
        return f"{reasoning}\n{CLOSE}\n\n" if opened else f"{OPEN}\n{reasoning}\n{CLOSE}\n\n"
