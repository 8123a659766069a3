"""Generate instruction-following rows: a writing request plus 1-3 compatible verifiable instructions.

    gym-bridge data prepare instruction_following --split train --size 1000 --seed 0 --output if_train.jsonl

Each instruction kind has a sentence that states it and a seeded choice of its arguments. Kinds
that shape the whole response (JSON, two responses, a fixed answer) come alone; at most one kind
per group (length, paragraphs, letter case) is used. Requests 0-29 make the train split, 30-39
the validation split. A row that an empty answer would follow (say, only "less than 50 words")
gets a keyword instruction as well.
"""

from __future__ import annotations

import random
from typing import Any, Callable

from environments.instruction_following.checks import follows

REQUESTS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Describe how a bicycle works to a ten-year-old.",
    "Write a product description for a reusable water bottle.",
    "Explain why the sky is blue.",
    "Write a letter to a neighbor asking them to water your plants while you travel.",
    "Give advice to someone starting their first job.",
    "Describe your ideal weekend.",
    "Write a poem about autumn leaves.",
    "Explain how to make a cup of tea.",
    "Write a review of a fictional restaurant called The Green Spoon.",
    "Summarize the benefits of regular exercise.",
    "Write a speech for a school science fair opening.",
    "Describe a city you would like to visit and why.",
    "Explain what a budget is and how to keep one.",
    "Write a blog post about learning to play the guitar.",
    "Give tips for a successful job interview.",
    "Write a fairy tale about a clever fox.",
    "Explain how plants grow from seeds.",
    "Write an email inviting your team to a summer picnic.",
    "Describe the rules of a game you invent.",
    "Write a motivational message for students before exams.",
    "Explain how rain forms.",
    "Write a short biography of a fictional inventor named Ada Bell.",
    "Describe the sounds of a busy market.",
    "Give instructions for planting a small herb garden.",
    "Write a diary entry from a cat's point of view.",
    "Explain why sleep is important.",
    "Write an advertisement for a new board game.",
    "Describe a memorable train journey.",
    "Write a thank-you note to a teacher.",
    "Explain how a library organizes its books.",
    "Write a story about a robot learning to paint.",
    "Describe the perfect sandwich.",
    "Give advice on keeping a houseplant alive.",
    "Write a poem about the ocean at night.",
    "Explain how to prepare for a long hike.",
    "Write a welcome message for new members of a chess club.",
    "Describe a festival in a small village.",
    "Explain what makes a good friend.",
    "Write a short mystery about a missing umbrella.",
)
KEYWORDS = ("river", "window", "journey", "garden", "silver", "morning", "music", "bridge", "candle", "harbor")
FORBIDDEN = ("very", "really", "thing", "nice", "good", "bad", "just", "like")
Spec = tuple[str, dict[str, Any], str]
Maker = Callable[[random.Random, str], Spec]


def _relation(rng: random.Random) -> str:
    return rng.choice(("less than", "at least"))


def number_words(rng, request):
    relation = _relation(rng)
    n = rng.choice((50, 80, 120)) if relation == "less than" else rng.choice((20, 40, 60))
    return "length_constraints:number_words", {"relation": relation, "num_words": n}, f"Answer with {relation} {n} words."


def number_sentences(rng, request):
    relation = _relation(rng)
    n = rng.randrange(4, 8) if relation == "less than" else rng.randrange(2, 5)
    return "length_constraints:number_sentences", {"relation": relation, "num_sentences": n}, f"Your response should contain {relation} {n} sentences."


def number_paragraphs(rng, request):
    n = rng.randrange(2, 4)
    return "length_constraints:number_paragraphs", {"num_paragraphs": n}, f"Write exactly {n} paragraphs, separated from each other by the markdown divider: ***"


def nth_paragraph(rng, request):
    n = rng.randrange(2, 4)
    k, word = rng.randrange(1, n + 1), rng.choice(("today", "first", "however", "finally", "imagine"))
    return ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": n, "nth_paragraph": k, "first_word": word},
            f"There should be {n} paragraphs, separated by blank lines. Paragraph {k} must start with the word '{word}'.")


def multiple_sections(rng, request):
    n, spliter = rng.randrange(2, 4), rng.choice(("Section", "SECTION", "Part"))
    return ("detectable_format:multiple_sections", {"section_spliter": spliter, "num_sections": n},
            f"Your response must have {n} sections. Mark the beginning of each section with {spliter} X, such as: {spliter} 1")


def existence(rng, request):
    chosen = rng.sample(KEYWORDS, 2)
    return "keywords:existence", {"keywords": chosen}, f"Include the keywords '{chosen[0]}' and '{chosen[1]}' in the response."


def frequency(rng, request):
    word, relation = rng.choice(KEYWORDS), _relation(rng)
    n = rng.randrange(2, 4)
    return "keywords:frequency", {"keyword": word, "frequency": n, "relation": relation}, f"Use the word '{word}' {relation} {n} times."


def forbidden(rng, request):
    chosen = rng.sample(FORBIDDEN, 2)
    return "keywords:forbidden_words", {"forbidden_words": chosen}, f"Do not use the words '{chosen[0]}' or '{chosen[1]}'."


def letter_frequency(rng, request):
    letter, relation = rng.choice("bdgkmpwy"), _relation(rng)
    n = rng.randrange(3, 8)
    return ("keywords:letter_frequency", {"letter": letter, "let_frequency": n, "let_relation": relation},
            f"The letter '{letter}' should appear {relation} {n} times in your response.")


def placeholders(rng, request):
    n = rng.randrange(1, 4)
    return ("detectable_content:number_placeholders", {"num_placeholders": n},
            f"Include at least {n} placeholders in square brackets, such as [name].")


def postscript(rng, request):
    marker = rng.choice(("P.S.", "P.P.S"))
    return "detectable_content:postscript", {"postscript_marker": marker}, f"At the end of your response, add a postscript starting with {marker}"


def bullets(rng, request):
    n = rng.randrange(2, 5)
    return ("detectable_format:number_bullet_lists", {"num_bullets": n},
            f"Your answer must contain exactly {n} bullet points, written as markdown bullets such as:\n* This is a point.")


def highlights(rng, request):
    n = rng.randrange(1, 4)
    return ("detectable_format:number_highlighted_sections", {"num_highlights": n},
            f"Highlight at least {n} parts of your answer with markdown, i.e. *highlighted part*.")


def title(rng, request):
    return "detectable_format:title", {}, "Your answer must contain a title, wrapped in double angular brackets, such as <<poem of joy>>."


def end_checker(rng, request):
    phrase = rng.choice(("Is there anything else I can help with?", "Thank you for reading.", "That is all."))
    return "startend:end_checker", {"end_phrase": phrase}, f"Finish your response with this exact phrase: {phrase} No other words should follow it."


def no_comma(rng, request):
    return "punctuation:no_comma", {}, "Do not use any commas in your response."


def capital_frequency(rng, request):
    relation = _relation(rng)
    n = rng.randrange(2, 5)
    return ("change_case:capital_word_frequency", {"capital_frequency": n, "capital_relation": relation},
            f"Words written in all capital letters should appear {relation} {n} times.")


def lowercase(rng, request):
    return "change_case:english_lowercase", {}, "Your entire response should be in English and in lowercase letters only: no capital letters."


def capital(rng, request):
    return "change_case:english_capital", {}, "Your entire response should be in English and in capital letters only."


def json_format(rng, request):
    return "detectable_format:json_format", {}, "Wrap your entire output in JSON format; you may use markdown ticks such as ```."


def two_responses(rng, request):
    return "combination:two_responses", {}, "Give two different responses, separated by six asterisk symbols: ******"


def constrained(rng, request):
    return ("detectable_format:constrained_response", {},
            "Answer with one of the following options: ('My answer is yes.', 'My answer is no.', 'My answer is maybe.')")


def quotation(rng, request):
    return "startend:quotation", {}, "Wrap your entire response with double quotation marks."


def repeat_prompt(rng, request):
    return ("combination:repeat_prompt", {"prompt_to_repeat": request},
            "First repeat the request above word for word without change, then give your answer.")


ALONE: tuple[Maker, ...] = (json_format, two_responses, constrained, quotation, repeat_prompt)
"""Kinds that shape the whole response: a row has no other instruction."""
GROUPS: tuple[tuple[Maker, ...], ...] = (
    (number_words, number_sentences), (number_paragraphs, nth_paragraph, multiple_sections), (capital_frequency, lowercase, capital),
    (existence,), (frequency,), (forbidden,), (letter_frequency,), (placeholders,), (postscript,), (bullets,), (highlights,),
    (title,), (end_checker,), (no_comma,),
)
"""At most one kind per group in a row."""


def _instructions(rng: random.Random, request: str) -> list[Spec]:
    if rng.random() < 0.2:
        return [rng.choice(ALONE)(rng, request)]
    groups = rng.sample(GROUPS, rng.randrange(1, 4))
    specs = [rng.choice(group)(rng, request) for group in groups]
    ids = {spec[0] for spec in specs}
    if ids & {"change_case:english_lowercase", "change_case:english_capital"} and ids & {"detectable_content:postscript", "startend:end_checker", "detectable_format:title"}:
        specs = [spec for spec in specs if spec[0] not in ("detectable_content:postscript", "startend:end_checker", "detectable_format:title")]
    if all(follows(instruction_id, kwargs, "") for instruction_id, kwargs, _ in specs) and "keywords:existence" not in ids:
        specs.append(existence(rng, request))  # an empty answer must not earn the reward
    return specs


def generate_rows(*, size: int, seed: int, split: str = "train", grading_mode: str = "binary") -> list[dict[str, Any]]:
    """`size` rows in NeMo Gym's format; equal arguments give equal rows."""
    rng = random.Random(f"{split}:{seed}")
    requests = REQUESTS[:30] if split == "train" else REQUESTS[30:]
    rows = []
    for index in range(size):
        request = rng.choice(requests)
        specs = _instructions(rng, request)
        prompt = request + "\n\n" + "\n".join(text for _, _, text in specs)
        rows.append({
            "id": index,
            "responses_create_params": {"input": [{"role": "user", "content": prompt}]},
            "verifier_metadata": {"instruction_id_list": [spec[0] for spec in specs], "kwargs": [spec[1] for spec in specs],
                                  "grading_mode": grading_mode, "prompt": prompt},
            "agent_ref": {"type": "responses_api_agents", "name": "instruction_following"},
        })
    return rows
