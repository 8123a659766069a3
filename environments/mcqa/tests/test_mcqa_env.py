"""The mcqa environment: letter extraction per grading mode, allowed letters, row checks, example data."""

from __future__ import annotations

import pytest

from environments.mcqa import MCQAEnvironment, extract_letter
from gym_bridge.core.items import function_call_item, message_item, reasoning_item
from gym_bridge.core.registry import register, resolve_tasks
from gym_bridge.core.task import load_tasks, parse_task

OPTIONS = [{"A": "Berlin"}, {"B": "Madrid"}, {"C": "Paris"}, {"D": "Rome"}]


def grade(text: str, *, mode: str = "strict_single_letter_boxed", expected: str = "C", options=OPTIONS, **extra):
    row = {"prompt": "Capital of France?", "options": options, "expected_answer": expected, "grading_mode": mode, **extra}
    return MCQAEnvironment().verify(parse_task(row, index=0, default_env="mcqa"), [message_item(text, item_id="msg_1")])


@pytest.mark.parametrize(
    "text",
    [r"\boxed{C}", r"Paris is the capital. \boxed{C}", r"\boxed{\text{C}}", r"Final: \boxed{ [C] }", r"\boxed{(C)}",
     r"\boxed{C: Paris}", r"\boxed{C) Paris}", r"first \boxed{A}, no wait: \boxed{C}"],
)
def test_strict_mode_accepts_a_boxed_letter(text: str) -> None:
    result = grade(text)
    assert (result.reward, result.metrics["extracted_answer"]) == (1.0, "C")


@pytest.mark.parametrize(
    "text",
    [r"\boxed{A}", "C", "The answer is C.", r"\boxed{Paris}", r"\boxed{c}", r"\boxed{C} then \boxed{A}", r"\boxed{C", r"\boxed{CD}"],
)
def test_strict_mode_rejects_a_wrong_or_unboxed_letter(text: str) -> None:
    assert grade(text).reward == 0.0


def test_letters_outside_the_options_are_not_answers() -> None:
    assert grade(r"\boxed{E}", expected="C").metrics["extracted_answer"] is None
    # an option whose text is null is not an allowed letter
    assert grade(r"\boxed{D}", expected="D", options=[*OPTIONS[:3], {"D": None}]).reward == 0.0


def test_lenient_boxed_matches_exactly_one_option_text() -> None:
    assert grade(r"\boxed{C}", mode="lenient_boxed").reward == 1.0
    assert grade(r"\boxed{  PARIS }", mode="lenient_boxed").reward == 1.0
    assert grade(r"\boxed{\text{paris}}", mode="lenient_boxed").reward == 1.0
    assert grade(r"\boxed{Rome}", mode="lenient_boxed").reward == 0.0
    assert grade(r"\boxed{Paris or Rome}", mode="lenient_boxed").metrics["extracted_answer"] is None  # two options match
    assert grade("Paris", mode="lenient_boxed").reward == 0.0  # outside a box


def test_lenient_answer_colon() -> None:
    assert grade("I think so.\nAnswer: C", mode="lenient_answer_colon").reward == 1.0
    assert grade("answer:c", mode="lenient_answer_colon").reward == 1.0
    assert grade("Answer: paris", mode="lenient_answer_colon").reward == 1.0
    assert grade("Answer: B", mode="lenient_answer_colon").reward == 0.0
    assert grade("Answer: C because it is Paris", mode="lenient_answer_colon").reward == 0.0  # neither a letter nor an option text
    assert grade(r"\boxed{C}", mode="lenient_answer_colon").reward == 0.0
    # the first "Answer:" counts, as in NeMo Gym
    assert grade("Answer: A\nAnswer: C", mode="lenient_answer_colon").reward == 0.0


def test_output_regex_is_tried_first_and_falls_back_to_the_mode() -> None:
    template = {"output_regex": r"Final Choice:\s*([A-Za-z])"}
    assert grade("blah\nFinal Choice: c", template_metadata=template).reward == 1.0
    assert grade("Final Choice: A ... Final Choice: C", template_metadata=template).reward == 1.0  # the last match
    assert grade(r"no match here \boxed{C}", template_metadata=template).reward == 1.0  # falls back to strict boxed
    assert grade(r"\boxed{C}", template_metadata={"output_regex": "(unclosed"}).reward == 1.0  # bad regex skipped
    assert grade("ANSWER IS Paris", template_metadata={"output_regex": [r"nothing(\w)", r"ANSWER IS\s*(\w+)"]}).reward == 1.0


def test_all_assistant_text_is_read_and_bad_output_is_scored_0() -> None:
    output = [reasoning_item(r"\boxed{A}", item_id="rs_1"), message_item("Let me think.", item_id="m1"),
              function_call_item("x", "{", call_id="c1", item_id="f1"), message_item(r"\boxed{C}", item_id="m2")]
    row = {"prompt": "q", "options": OPTIONS, "expected_answer": "C"}
    assert MCQAEnvironment().verify(parse_task(row, index=0, default_env="mcqa"), output).reward == 1.0
    assert grade("").reward == 0.0
    assert grade("\x00\ufffd" * 50).reward == 0.0
    malformed = grade(r"\boxed{C}", options=[{"CC": "Paris"}, "junk", None])
    assert (malformed.reward, malformed.mask_sample) == (0.0, False)


def test_rows_without_an_answer_or_with_an_unknown_mode_are_masked_verifier_failures() -> None:
    result = grade(r"\boxed{C}", expected="")
    assert (result.mask_sample, result.failure_kind) == (True, "verifier")
    result = grade(r"\boxed{C}", mode="bogus")
    assert (result.mask_sample, result.failure_kind) == (True, "verifier")
    assert "bogus" in result.failure_reason


def test_validate_row_names_each_bad_field() -> None:
    good = {"options": OPTIONS, "expected_answer": "C"}
    assert MCQAEnvironment.validate_row(good) == []
    fields = lambda row: sorted(p.field for p in MCQAEnvironment.validate_row(row))  # noqa: E731
    assert fields({"options": OPTIONS}) == ["expected_answer"]
    assert fields({"expected_answer": "C"}) == ["options"]
    assert fields({**good, "expected_answer": "E"}) == ["expected_answer"]
    assert fields({**good, "grading_mode": "loose"}) == ["grading_mode"]
    assert fields({**good, "options": [{"AB": "x"}, {"C": "Paris"}]}) == ["options[0]"]
    assert fields({**good, "template_metadata": {"output_regex": "("}}) == ["template_metadata.output_regex[0]"]


def test_extract_letter_is_case_sensitive_in_strict_mode_like_nemo_gym() -> None:
    assert extract_letter(r"\boxed{b}", options=OPTIONS, grading_mode="strict_single_letter_boxed") is None
    assert extract_letter(r"\boxed{B}", options=OPTIONS, grading_mode="strict_single_letter_boxed") == "B"


def test_example_rows_route_and_score_1_with_their_answers_and_0_otherwise() -> None:
    register(MCQAEnvironment)
    tasks = load_tasks(MCQAEnvironment.example_data)
    assert len(tasks) >= 8
    assert resolve_tasks(tasks) == {"mcqa": MCQAEnvironment}
    env = MCQAEnvironment()
    for task in tasks:
        assert MCQAEnvironment.validate_row(task.row) == []
        expected = task.get("expected_answer")
        wrong = next(letter for entry in task.get("options") for letter in entry if letter != expected)
        form = "Answer: {}" if task.get("grading_mode") == "lenient_answer_colon" else r"\boxed{{{}}}"
        assert env.verify(task, [message_item(form.format(expected), item_id="m")]).reward == 1.0, task.source
        assert env.verify(task, [message_item(form.format(wrong), item_id="m")]).reward == 0.0, task.source
