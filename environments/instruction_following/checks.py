"""Verifiable instructions: one check per IFEval instruction id, written from the instruction's meaning.

Each `Instruction` names its keyword arguments and their types (IFEval's names: `num_words` and
`relation`, `keywords`, `end_phrase`, ...) and a check `(response, **kwargs) -> bool`. Counting
relations are IFEval's: "less than" (count < N) and "at least" (count >= N). Nothing here
depends on the language of the response except the case checks' use of str.isupper/islower.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable

RELATIONS = ("less than", "at least")
CONSTRAINED_RESPONSES = ("My answer is yes.", "My answer is no.", "My answer is maybe.")
_ABBREVIATIONS = ("mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "inc", "ltd", "no", "fig")


@dataclass(frozen=True)
class Instruction:
    """A verifiable instruction: its keyword arguments (name -> type) and its check."""

    params: dict[str, type]
    check: Callable[..., bool]


def compare(count: int, relation: str, target: int) -> bool:
    """IFEval's comparison: "less than" is count < target, "at least" is count >= target."""
    if relation == "less than":
        return count < target
    if relation == "at least":
        return count >= target
    raise ValueError(f"relation must be one of {RELATIONS}, got {relation!r}")


def words(text: str) -> list[str]:
    """Runs of word characters (letters, digits, underscore)."""
    return re.findall(r"\w+", text)


def sentences(text: str) -> list[str]:
    """Sentences: text split after `.`, `!` or `?` followed by space, not after common
    abbreviations (Mr., e.g., ...), single initials or inside numbers like 3.5."""
    pieces, start = [], 0
    for match in re.finditer(r"[.!?]+(?=\s|$)", text):
        before = text[start:match.start()].split()
        last = before[-1].lower() if before else ""
        if match.group() == "." and (last.rstrip(".") in _ABBREVIATIONS or re.fullmatch(r"[a-z]", last)):
            continue
        pieces.append(text[start:match.end()])
        start = match.end()
    pieces.append(text[start:])
    return [piece.strip() for piece in pieces if piece.strip()]


def _paragraphs_by_divider(text: str) -> int | None:
    """Paragraphs separated by `***` lines; None when an empty one sits between two others."""
    parts = re.split(r"\s?\*\*\*\s?", text)
    count = len(parts)
    for position, part in enumerate(parts):
        if not part.strip():
            if position in (0, len(parts) - 1):
                count -= 1
            else:
                return None
    return count


def _first_word(paragraph: str) -> str:
    """The paragraph's first word, lower-cased, without leading quotes or trailing punctuation."""
    word = paragraph.split()[0].lstrip("'\"")
    return re.split(r"[.,?!'\"]", word, maxsplit=1)[0].lower()


def nth_paragraph_first_word(text: str, *, num_paragraphs: int, nth_paragraph: int, first_word: str) -> bool:
    paragraphs = [part for part in re.split(r"\n\n", text) if part.strip()]
    if len(paragraphs) != num_paragraphs or not 1 <= nth_paragraph <= len(paragraphs):
        return False
    return _first_word(paragraphs[nth_paragraph - 1].strip()) == first_word.lower()


def postscript(text: str, *, postscript_marker: str) -> bool:
    marker = postscript_marker.strip().lower()
    if marker in ("p.s.", "p.p.s", "p.p.s."):
        letters = [re.escape(letter) for letter in marker.replace(".", "")]
        pattern = r"\s?".join(letter + r"\." for letter in letters[:-1]) + r"\s?" + letters[-1]
    else:
        pattern = re.escape(marker)
    return re.search(r"\s*" + pattern + r".*$", text.lower(), flags=re.MULTILINE) is not None


def bullet_count(text: str) -> int:
    """Lines that start with `* ` (not `**`) or `-`, after optional indentation."""
    return len(re.findall(r"^\s*\*[^*].*$", text, flags=re.MULTILINE)) + len(re.findall(r"^\s*-.*$", text, flags=re.MULTILINE))


def highlight_count(text: str) -> int:
    """Non-empty `*highlighted*` and `**highlighted**` spans on one line."""
    single = [span for span in re.findall(r"\*[^\n*]*\*", text) if span.strip("*").strip()]
    double = [span for span in re.findall(r"\*\*[^\n*]*\*\*", text) if span[2:-2].strip()]
    return len(single) + len(double)


def is_json(text: str) -> bool:
    """The whole response (inside an optional ``` or ```json fence) is one JSON value."""
    body = text.strip()
    body = re.sub(r"^```(?:json)?", "", body, flags=re.IGNORECASE).removesuffix("```").strip()
    try:
        json.loads(body)
    except ValueError:
        return False
    return True


def two_responses(text: str) -> bool:
    parts = text.split("******")
    if any(not part.strip() for part in parts[1:-1]):
        return False
    kept = [part.strip() for part in parts if part.strip()]
    return len(kept) == 2 and kept[0] != kept[1]


def _capital_words(text: str) -> int:
    return sum(1 for word in words(text) if word.isupper())


INSTRUCTIONS: dict[str, Instruction] = {
    "keywords:existence": Instruction(
        {"keywords": list}, lambda text, keywords: all(re.search(re.escape(k), text, flags=re.IGNORECASE) for k in keywords)),
    "keywords:frequency": Instruction(
        {"keyword": str, "frequency": int, "relation": str},
        lambda text, keyword, frequency, relation: compare(len(re.findall(re.escape(keyword), text, flags=re.IGNORECASE)), relation, frequency)),
    "keywords:forbidden_words": Instruction(
        {"forbidden_words": list},
        lambda text, forbidden_words: not any(re.search(rf"\b{re.escape(w)}\b", text, flags=re.IGNORECASE) for w in forbidden_words)),
    "keywords:letter_frequency": Instruction(
        {"letter": str, "let_frequency": int, "let_relation": str},
        lambda text, letter, let_frequency, let_relation: compare(text.lower().count(letter.lower()), let_relation, let_frequency)),
    "length_constraints:number_words": Instruction(
        {"num_words": int, "relation": str}, lambda text, num_words, relation: compare(len(words(text)), relation, num_words)),
    "length_constraints:number_sentences": Instruction(
        {"num_sentences": int, "relation": str}, lambda text, num_sentences, relation: compare(len(sentences(text)), relation, num_sentences)),
    "length_constraints:number_paragraphs": Instruction(
        {"num_paragraphs": int}, lambda text, num_paragraphs: _paragraphs_by_divider(text) == num_paragraphs),
    "length_constraints:nth_paragraph_first_word": Instruction(
        {"num_paragraphs": int, "nth_paragraph": int, "first_word": str}, nth_paragraph_first_word),
    "detectable_content:number_placeholders": Instruction(
        {"num_placeholders": int}, lambda text, num_placeholders: len(re.findall(r"\[.*?\]", text)) >= num_placeholders),
    "detectable_content:postscript": Instruction({"postscript_marker": str}, postscript),
    "detectable_format:number_bullet_lists": Instruction({"num_bullets": int}, lambda text, num_bullets: bullet_count(text) == num_bullets),
    "detectable_format:constrained_response": Instruction({}, lambda text: any(option in text.strip() for option in CONSTRAINED_RESPONSES)),
    "detectable_format:number_highlighted_sections": Instruction(
        {"num_highlights": int}, lambda text, num_highlights: highlight_count(text) >= num_highlights),
    "detectable_format:multiple_sections": Instruction(
        {"section_spliter": str, "num_sections": int},
        lambda text, section_spliter, num_sections: len(re.split(r"\s?" + re.escape(section_spliter) + r"\s?\d+\s?", text)) - 1 >= num_sections),
    "detectable_format:json_format": Instruction({}, is_json),
    "detectable_format:title": Instruction({}, lambda text: any(t[2:-2].strip() for t in re.findall(r"<<[^\n]+>>", text))),
    "combination:two_responses": Instruction({}, two_responses),
    "combination:repeat_prompt": Instruction(
        {"prompt_to_repeat": str}, lambda text, prompt_to_repeat: text.strip().lower().startswith(prompt_to_repeat.strip().lower())),
    "startend:end_checker": Instruction(
        {"end_phrase": str}, lambda text, end_phrase: text.strip().strip('"').lower().endswith(end_phrase.strip().lower())),
    "startend:quotation": Instruction({}, lambda text: len(text.strip()) > 1 and text.strip()[0] == text.strip()[-1] == '"'),
    "change_case:capital_word_frequency": Instruction(
        {"capital_frequency": int, "capital_relation": str},
        lambda text, capital_frequency, capital_relation: compare(_capital_words(text), capital_relation, capital_frequency)),
    "change_case:english_capital": Instruction({}, lambda text: text.isupper()),
    "change_case:english_lowercase": Instruction({}, lambda text: text.islower()),
    "punctuation:no_comma": Instruction({}, lambda text: "," not in text),
}


def kwargs_problems(instruction_id: str, kwargs: Any) -> list[str]:
    """What is wrong with an instruction's keyword arguments ([] when they are usable).

    `None` (for all of them) and `None` values count as absent, as in IFEval's datasets.
    """
    instruction = INSTRUCTIONS.get(instruction_id)
    if instruction is None:
        return [f"unsupported instruction id {instruction_id!r}"]
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        return [f"kwargs must be an object, got {type(kwargs).__name__}"]
    given = {key: value for key, value in kwargs.items() if value is not None}
    problems = [f"unexpected argument {key!r}" for key in given if key not in instruction.params]
    for name, kind in instruction.params.items():
        value = given.get(name)
        if value is None:
            problems.append(f"missing argument {name!r}")
        elif kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            problems.append(f"{name} must be an integer, got {value!r}")
        elif kind is list and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            problems.append(f"{name} must be a list of strings, got {value!r}")
        elif kind is str and not isinstance(value, str):
            problems.append(f"{name} must be a string, got {value!r}")
        elif name.endswith("relation") and value not in RELATIONS:
            problems.append(f"{name} must be one of {RELATIONS}, got {value!r}")
    return problems


def follows(instruction_id: str, kwargs: dict[str, Any] | None, response: str) -> bool:
    """Whether `response` follows the instruction. Raises ValueError when `kwargs_problems` finds any."""
    problems = kwargs_problems(instruction_id, kwargs)
    if problems:
        raise ValueError(f"{instruction_id}: {'; '.join(problems)}")
    given = {key: value for key, value in (kwargs or {}).items() if value is not None}
    return bool(INSTRUCTIONS[instruction_id].check(response, **given))
