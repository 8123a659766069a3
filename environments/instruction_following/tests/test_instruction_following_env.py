"""instruction_following: every checker on a response that follows it and one that does not; modes; rows."""

from __future__ import annotations

import pytest

from environments.instruction_following import InstructionFollowingEnvironment as IF
from environments.instruction_following.checks import INSTRUCTIONS, follows, kwargs_problems, sentences
from environments.instruction_following.generate import generate_rows
from gym_bridge.core.items import function_call_item, message_item
from gym_bridge.core.registry import register, resolve_tasks
from gym_bridge.core.task import load_tasks, parse_task

# (instruction id, kwargs, a response that follows it, a response that does not)
CASES = [
    ("keywords:existence", {"keywords": ["river", "Bridge"]}, "The bridge crossed the River.", "The bridge crossed the road."),
    ("keywords:frequency", {"keyword": "tea", "frequency": 2, "relation": "at least"}, "Tea is good; I like TEA.", "Tea is good."),
    ("keywords:frequency", {"keyword": "tea", "frequency": 2, "relation": "less than"}, "Tea is good.", "tea and tea"),
    ("keywords:forbidden_words", {"forbidden_words": ["very", "nice"]}, "It was everything I hoped for.", "It was Very good."),
    ("keywords:letter_frequency", {"letter": "z", "let_frequency": 3, "let_relation": "at least"}, "Zig zag zoo", "Zig zag"),
    ("length_constraints:number_words", {"num_words": 5, "relation": "less than"}, "Four words right here.", "Five words are right here."),
    ("length_constraints:number_words", {"num_words": 3, "relation": "at least"}, "one two three", "one two"),
    ("length_constraints:number_sentences", {"num_sentences": 3, "relation": "at least"}, "Mr. Lee ran. He won 3.5 medals! Wow?",
     "Mr. Lee ran. He won 3.5 medals!"),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "First part.\n***\nSecond part.", "First part.\n***\n***\nSecond part."),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 3, "nth_paragraph": 2, "first_word": "then"},
     "Start here.\n\n\"Then, we go.\n\nEnd.", "Start here.\n\nNext we go.\n\nEnd."),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Dear [name], see you at [place].", "Dear [name], see you."),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hello.\nP.S. Bring snacks.", "Hello. Bring snacks."),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Hello.\np.p.s see you", "Hello.\nP.S. see you"),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "Items:\n* apples\n- pears", "Items:\n* apples\n* pears\n* figs"),
    ("detectable_format:constrained_response", {}, "My answer is maybe.", "Maybe."),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "*one* and **two**", "*one* and ** **"),
    ("detectable_format:multiple_sections", {"section_spliter": "Section", "num_sections": 2}, "Section 1\nhi\nSection 2\nbye",
     "Section 1\nhi and bye"),
    ("detectable_format:json_format", {}, '```json\n{"a": [1, 2]}\n```', '{"a": 1} and more'),
    ("detectable_format:title", {}, "<<A Day Out>>\nWe went out.", "<< >>\nWe went out."),
    ("combination:two_responses", {}, "Yes it is.\n******\nNo it is not.", "Same.\n******\nSame."),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Describe tea."}, "describe tea. Tea is a drink.", "Tea is a drink."),
    ("startend:end_checker", {"end_phrase": "That is all."}, 'Here it is. That is all."', "That is all. Bye."),
    ("startend:quotation", {}, '"Quoted answer."', "Quoted answer."),
    ("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": "at least"}, "THIS is VERY loud", "This is VERY loud"),
    ("change_case:english_capital", {}, "ALL CAPS, 100%!", "ALL CAPS except this"),
    ("change_case:english_lowercase", {}, "all lowercase here.", "Not all lowercase."),
    ("punctuation:no_comma", {}, "No commas here.", "Commas, here."),
]


def test_at_least_twenty_instruction_kinds_are_checked_each_one_below() -> None:
    assert len(INSTRUCTIONS) >= 20
    assert {case[0] for case in CASES} == set(INSTRUCTIONS)


@pytest.mark.parametrize(("instruction_id", "kwargs", "good", "bad"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_instruction_on_a_following_and_a_violating_response(instruction_id, kwargs, good, bad) -> None:
    assert follows(instruction_id, kwargs, good) is True
    assert follows(instruction_id, kwargs, bad) is False


def test_sentence_splitting_keeps_abbreviations_initials_and_decimals() -> None:
    assert sentences("Dr. J. Smith paid 3.5 dollars. Then e.g. this. Done!") == ["Dr. J. Smith paid 3.5 dollars.", "Then e.g. this.", "Done!"]


def test_kwargs_are_checked_by_name_and_type_and_none_means_absent() -> None:
    assert kwargs_problems("punctuation:no_comma", None) == []
    assert kwargs_problems("length_constraints:number_words", {"num_words": 5, "relation": "less than", "keywords": None}) == []
    assert kwargs_problems("length_constraints:number_words", {"num_words": "5", "relation": "fewer"}) == [
        "num_words must be an integer, got '5'", "relation must be one of ('less than', 'at least'), got 'fewer'"]
    assert kwargs_problems("keywords:existence", {"keyword": ["x"]}) == ["unexpected argument 'keyword'", "missing argument 'keywords'"]
    assert kwargs_problems("language:response_language", {"language": "fr"}) == ["unsupported instruction id 'language:response_language'"]


def grade(metadata: dict, text: str, **top):
    row = {"prompt": "Write.", "verifier_metadata": metadata, **top} if metadata else {"prompt": "Write.", **top}
    return IF().verify(parse_task(row, index=0, default_env="instruction_following"), [message_item(text, item_id="m")])


TWO = {"instruction_id_list": ["punctuation:no_comma", "length_constraints:number_words"], "kwargs": [None, {"num_words": 3, "relation": "less than"}]}


def test_binary_needs_every_instruction_and_fraction_counts_them() -> None:
    assert grade(TWO, "Short answer").reward == 1.0
    assert grade(TWO, "Short, answer").reward == 0.0
    half = grade({**TWO, "grading_mode": "fraction"}, "Short, answer")
    assert half.reward == 0.5 and half.metrics["follow_instruction_list"] == [False, True]
    assert grade({**TWO, "grading_mode": "fraction"}, "Far, too, many words here").reward == 0.0


def test_the_last_assistant_message_is_checked_and_odd_output_is_data() -> None:
    task = parse_task({"prompt": "x", "verifier_metadata": TWO}, index=0, default_env="instruction_following")
    output = [message_item("Long, with commas, and many words", item_id="m1"), function_call_item("f", "{", call_id="c", item_id="f"),
              message_item("Fine now", item_id="m2")]
    assert IF().verify(task, output).reward == 1.0
    # no message at all: the empty text is checked, as in NeMo Gym (it has no comma and fewer than 3 words)
    assert IF().verify(task, []).reward == 1.0
    assert grade({"instruction_id_list": ["detectable_format:json_format"], "kwargs": [{}]}, "\x00{not json").reward == 0.0


def test_top_level_fields_of_older_rows_are_read() -> None:
    assert grade({}, "Short answer", instruction_id_list=TWO["instruction_id_list"], kwargs=TWO["kwargs"]).reward == 1.0


def test_rows_that_cannot_be_checked_are_masked_verifier_failures() -> None:
    result = grade({"instruction_id_list": ["language:response_language"], "kwargs": [{"language": "fr"}]}, "Bonjour")
    assert (result.mask_sample, result.failure_kind) == (True, "verifier") and "unsupported" in result.failure_reason
    result = grade({"instruction_id_list": ["length_constraints:number_words"], "kwargs": [{}]}, "hi")
    assert (result.mask_sample, result.failure_kind) == (True, "verifier") and "missing argument 'num_words'" in result.failure_reason


def test_validate_row_names_each_field() -> None:
    assert IF.validate_row({"verifier_metadata": TWO}) == []
    fields = lambda row: [p.field for p in IF.validate_row(row)]  # noqa: E731
    assert fields({}) == ["verifier_metadata.instruction_id_list", "verifier_metadata.kwargs"]
    assert fields({"verifier_metadata": {**TWO, "kwargs": [None]}}) == ["verifier_metadata.kwargs"]
    assert fields({"verifier_metadata": {**TWO, "grading_mode": "partial"}}) == ["verifier_metadata.grading_mode"]
    bad_kwargs = {**TWO, "kwargs": [None, {"num_words": 3, "relation": "most"}]}
    assert fields({"verifier_metadata": bad_kwargs}) == ["verifier_metadata.kwargs[1]"]


def test_example_rows_route_validate_and_are_not_trivially_followed() -> None:
    register(IF)
    tasks = load_tasks(IF.example_data)
    assert len(tasks) >= 10 and resolve_tasks(tasks) == {"instruction_following": IF}
    modes = {task.get("verifier_metadata")["grading_mode"] for task in tasks}
    assert modes == {"binary", "fraction"}
    for task in tasks:
        assert IF.validate_row(task.row) == []
        assert IF().verify(task, [message_item("", item_id="m")]).reward < 1.0, task.source


def test_generated_rows_are_seeded_valid_and_splits_use_different_requests() -> None:
    train = IF.prepare_rows(split="train", size=200, seed=3)
    assert train == IF.prepare_rows(split="train", size=200, seed=3)
    assert all(IF.validate_row(row) == [] for row in train)
    empty = [message_item("", item_id="m")]
    assert all(IF().verify(parse_task(row, index=0), empty).reward == 0.0 for row in train)  # no free reward for saying nothing
    assert len({i for row in train for i in row["verifier_metadata"]["instruction_id_list"]}) == len(INSTRUCTIONS)
    validation = generate_rows(size=50, seed=3, split="validation")
    first_line = lambda rows: {row["responses_create_params"]["input"][0]["content"].split("\n")[0] for row in rows}  # noqa: E731
    assert not first_line(train) & first_line(validation)
