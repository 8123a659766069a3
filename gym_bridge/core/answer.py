r"""Pulling a final answer out of model text: the last `\boxed{...}`, or an `<answer>` tag.

Shared by the verifiers of answer-checking environments (math, mcqa, reasoning_gym). Both
functions return None when there is nothing to extract, never raise on odd text.
"""

from __future__ import annotations

import re

_BOXED = re.compile(r"\\boxed\s*\{")


def last_boxed(text: str) -> str | None:
    r"""The contents of the last `\boxed{...}` in `text` (nested braces allowed), stripped; None
    when there is none or it is not closed."""
    matches = list(_BOXED.finditer(text))
    if not matches:
        return None
    start = matches[-1].end()
    depth = 0
    for position in range(start, len(text)):
        if text[position] == "{":
            depth += 1
        elif text[position] == "}":
            if depth == 0:
                return text[start:position].strip()
            depth -= 1
    return None


def last_tagged(text: str, tag: str = "answer") -> str | None:
    """The stripped contents of the last `<tag>...</tag>` in `text` (across lines), or None."""
    matches = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, flags=re.DOTALL)
    return matches[-1].strip() if matches else None
