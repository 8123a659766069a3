r"""mcqa: multiple-choice questions; the answer letter is extracted by the row's `grading_mode`.

Rows follow NeMo Gym's `mcqa` resources server: `options` (a list of one-letter dicts, e.g.
`[{"A": "Paris"}, {"B": "Rome"}]`, whose keys are the allowed letters), `expected_answer` (a
letter) and `grading_mode`: `strict_single_letter_boxed` (the default: a letter in the last
`\boxed{}`), `lenient_boxed` (that, else the text of exactly one option inside the box) or
`lenient_answer_colon` (what follows the first `Answer:`). An optional
`template_metadata.output_regex` is tried first. Reward 1.0 iff the extracted letter is the
expected one. See README.md for each rule.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any, Literal

import pydantic

from gym_bridge import Environment, Item, RowProblem, Task, VerifyResult, last_boxed, output_text

GradingMode = Literal["strict_single_letter_boxed", "lenient_boxed", "lenient_answer_colon"]
GRADING_MODES: tuple[str, ...] = typing.get_args(GradingMode)

_TEXT_WRAPPER = re.compile(r"\\text\{\s*(.*?)\s*\}", re.DOTALL)
_BARE_LETTER = re.compile(r"[^A-Za-z]*([A-Z])[^A-Za-z]*")
_LABELLED_LETTER = re.compile(r"\s*([A-Z])\s*[:).\-]")
_ANSWER_COLON = re.compile(r"answer\s*:\s*(.+)", re.IGNORECASE)
# Letters of other scripts that models write for A-D (Arabic, Bengali, full-width Latin).
_LETTER_LOOKALIKES = str.maketrans({"أ": " A", "ب": " B", "ج": " C", "د": " D", "অ": " A", "ব": " B", "ড": " C", "ঢ": " D",
                                    "Ａ": " A", "Ｂ": " B", "Ｃ": " C", "Ｄ": " D"})


class TemplateMetadata(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")
    output_regex: str | list[str] | None = None


class MCQARow(pydantic.BaseModel):
    """The verifier fields of an mcqa row (other fields are allowed and ignored)."""

    model_config = pydantic.ConfigDict(extra="allow")
    options: list[dict[str, str | None]]
    """One dict per option, `{letter: text}`; options whose text is null are not allowed answers."""
    expected_answer: str
    grading_mode: GradingMode = "strict_single_letter_boxed"
    template_metadata: TemplateMetadata | None = None


def allowed_letters(options: Any) -> set[str]:
    """The upper-case letters of the options that have a text (malformed entries are skipped)."""
    letters = set()
    for entry in options if isinstance(options, list) else []:
        if isinstance(entry, dict):
            letters |= {key.upper() for key, text in entry.items() if isinstance(key, str) and len(key) == 1 and key.isalpha() and text is not None}
    return letters


def _option_texts(options: Any, letters: set[str]) -> list[tuple[str, str]]:
    pairs = []
    for entry in options if isinstance(options, list) else []:
        if isinstance(entry, dict):
            pairs += [(key.upper(), text) for key, text in entry.items() if isinstance(text, str) and isinstance(key, str) and key.upper() in letters]
    return pairs


def _normalized(text: str) -> str:
    return " ".join(text.lower().split())


def _unwrap_text(text: str) -> str:
    r"""Remove `\text{...}` wrappers around the whole string, repeatedly."""
    while (match := _TEXT_WRAPPER.fullmatch(text)) is not None:
        text = match.group(1)
    return text


def boxed_letter(text: str, letters: set[str]) -> str | None:
    r"""The letter in the last `\boxed{}`: alone (`C`, `[C]`, `\text{C}`) or labelling option text (`C: ...`)."""
    inner = last_boxed(text)
    if inner is None:
        return None
    inner = _unwrap_text(inner)
    match = _BARE_LETTER.fullmatch(inner) or _LABELLED_LETTER.match(inner)
    return match.group(1) if match and match.group(1) in letters else None


def boxed_option_text(text: str, options: Any, letters: set[str]) -> str | None:
    """The letter of the one option whose text (case and spacing ignored) occurs in the last box."""
    inner = last_boxed(text)
    if inner is None:
        return None
    candidates = {_normalized(inner), _normalized(_unwrap_text(inner))}
    matched = {letter for letter, option in _option_texts(options, letters) if _normalized(option) and any(_normalized(option) in c for c in candidates)}
    return matched.pop() if len(matched) == 1 else None


def answer_colon(text: str, options: Any, letters: set[str]) -> str | None:
    """The letter after the first `Answer:`: a single allowed letter, or an option's exact text."""
    match = _ANSWER_COLON.search(text)
    if match is None:
        return None
    candidate = _unwrap_text(match.group(1)).strip()
    if len(candidate) == 1 and candidate.isalpha() and candidate.upper() in letters:
        return candidate.upper()
    wanted = _normalized(candidate)
    return next((letter for letter, option in _option_texts(options, letters) if _normalized(option) == wanted), None)


def regex_letter(text: str, patterns: str | list[str], options: Any, letters: set[str]) -> str | None:
    """The letter captured by the last match of the first `output_regex` that yields one (case-insensitive).

    A captured single letter is trusted even when it is not an option; a longer capture must equal
    an option's text. Invalid patterns are skipped.
    """
    for pattern in [patterns] if isinstance(patterns, str) else patterns:
        try:
            matches = re.findall(pattern, text, flags=re.IGNORECASE)
        except re.error:
            continue
        if not matches:
            continue
        last = matches[-1]
        captured = last[0] if isinstance(last, tuple) else last  # a pattern with several groups: the first
        captured = captured.translate(_LETTER_LOOKALIKES).strip().upper()
        if len(captured) == 1 and captured.isalpha():
            return captured
        wanted = _normalized(captured)
        letter = next((letter for letter, option in _option_texts(options, letters) if _normalized(option) == wanted), None)
        if letter is not None:
            return letter
    return None


def extract_letter(text: str, *, options: Any, grading_mode: str, output_regex: str | list[str] | None = None) -> str | None:
    """The answer letter a response gives under `grading_mode` (and `output_regex`, tried first), or None."""
    letters = allowed_letters(options)
    letter = regex_letter(text, output_regex, options, letters) if output_regex else None
    if letter is None and grading_mode in ("strict_single_letter_boxed", "lenient_boxed"):
        letter = boxed_letter(text, letters)
        if letter is None and grading_mode == "lenient_boxed":
            letter = boxed_option_text(text, options, letters)
    elif letter is None and grading_mode == "lenient_answer_colon":
        letter = answer_colon(text, options, letters)
    return letter


class MCQAEnvironment(Environment):
    name = "mcqa"
    aliases = ("mcqa_simple_agent",)
    description = r"Multiple choice: answer with a letter (in \boxed{} or after 'Answer:'); reward 1 for the expected letter."
    example_data = Path(__file__).parent / "data" / "example.jsonl"
    resume = "replay"  # no tools: only its committed model calls are replayed
    row_schema = MCQARow

    @classmethod
    def validate_row(cls, row: dict[str, Any]) -> list[RowProblem]:
        problems = super().validate_row(row)
        if problems:
            return problems
        letters = allowed_letters(row["options"])
        for position, entry in enumerate(row["options"]):
            if len(entry) != 1 or not all(len(key) == 1 and key.isalpha() for key in entry):
                problems.append(RowProblem(f"options[{position}]", "must map one letter to the option's text, e.g. {\"A\": \"Paris\"}"))
        if row["expected_answer"].strip().upper() not in letters:
            problems.append(RowProblem("expected_answer", f"{row['expected_answer']!r} is not one of the option letters {sorted(letters)}"))
        regexes = (row.get("template_metadata") or {}).get("output_regex") or []
        for position, pattern in enumerate([regexes] if isinstance(regexes, str) else regexes):
            try:
                re.compile(pattern)
            except re.error as error:
                problems.append(RowProblem(f"template_metadata.output_regex[{position}]", f"invalid regex: {error}"))
        return problems

    def verify(self, task: Task, output: list[Item]) -> VerifyResult:
        expected = str(task.get("expected_answer") or "").strip().upper()
        mode = task.get("grading_mode") or "strict_single_letter_boxed"
        if not expected or mode not in GRADING_MODES:
            reason = "row has no expected_answer" if not expected else f"unknown grading_mode {mode!r}; known: {', '.join(GRADING_MODES)}"
            return VerifyResult(reward=0.0, mask_sample=True, failure_kind="verifier", failure_reason=reason)
        template = task.get("template_metadata")
        output_regex = template.get("output_regex") if isinstance(template, dict) else None
        text = output_text(output).strip()
        letter = extract_letter(text, options=task.get("options"), grading_mode=mode, output_regex=output_regex) if text else None
        correct = bool(expected) and letter == expected
        return VerifyResult(
            reward=float(correct),
            reward_components={"correct": float(correct)},
            metrics={"extracted_answer": letter, "expected_answer": expected, "no_answer": letter is None},
        )
