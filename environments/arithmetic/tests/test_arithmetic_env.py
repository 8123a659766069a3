"""arithmetic: known-right and known-wrong answers, the format component, disjoint generated splits."""

from __future__ import annotations

import pytest

from environments.arithmetic import ArithmeticEnvironment, make_row, parse_integer, problem_split
from gym_bridge import get_environment
from gym_bridge.core.items import message_item
from gym_bridge.core.task import load_tasks, parse_task
from gym_bridge.data import prepare, validate_file


def score(row: dict, text: str):
    task = parse_task(row, index=0, default_env="arithmetic")
    return ArithmeticEnvironment().verify(task, [message_item(text, item_id="msg_1")])


ROW = make_row(38, "-", 2)


@pytest.mark.parametrize("text", ["38 - 2 = 36. \\boxed{36}", "\\boxed{ 36 }", "so \\boxed{$36$}", "\\boxed{+36}"])
def test_right_answers_earn_1(text):
    result = score(ROW, text)
    assert result.reward == 1.0 and result.reward_components == {"correct": 1.0, "format": 0.0}


def test_a_wrong_boxed_integer_earns_the_format_reward_only():
    result = score(ROW, "38 - 2 = 35. \\boxed{35}")
    assert result.reward == pytest.approx(0.1) and result.reward_components == {"correct": 0.0, "format": pytest.approx(0.1)}
    assert result.metrics["boxed_integer"] is True and result.metrics["correct"] is False


@pytest.mark.parametrize("text", ["36", "\\boxed{thirty-six}", "\\boxed{36.5}", "\\boxed{36", "The answer is 36."])
def test_no_boxed_integer_earns_0(text):
    assert score(ROW, text).reward == 0.0


def test_the_last_box_counts_and_thousands_separators_parse():
    assert score(ROW, "\\boxed{36} no wait \\boxed{40}").reward == pytest.approx(0.1)
    assert parse_integer("1,234") == 1234 and parse_integer("12,34") is None and parse_integer(None) is None


def test_format_reward_is_a_setting():
    plain = type("PlainArithmetic", (ArithmeticEnvironment,), {"format_reward": 0.0})
    task = parse_task(ROW, index=0, default_env="arithmetic")
    assert plain().verify(task, [message_item("\\boxed{35}", item_id="m")]).reward == 0.0


def test_a_row_without_an_integer_answer_is_refused_and_masked():
    bad = {**ROW, "expected_answer": "x"}
    assert ArithmeticEnvironment.validate_row(bad)[0].field == "expected_answer"
    result = score(bad, "\\boxed{36}")
    assert result.mask_sample and result.failure_kind == "verifier"


def test_generated_splits_are_seeded_distinct_disjoint_and_right():
    train = prepare("arithmetic", split="train", size=300, seed=0)
    validation = prepare("arithmetic", split="validation", size=100, seed=0)
    assert prepare("arithmetic", split="train", size=300, seed=0) == train
    assert prepare("arithmetic", split="train", size=300, seed=1) != train
    questions = [row["question"] for row in train]
    assert len(set(questions)) == 300
    assert not set(questions) & {row["question"] for row in validation}
    for row in train[:50] + validation[:50]:
        a, symbol, b = row["question"].removeprefix("What is ").removesuffix("?").split()
        op = "*" if symbol == "×" else symbol
        assert problem_split(int(a), op, int(b)) in ("train", "validation")
        assert int(row["expected_answer"]) == {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
        assert score(row, f"\\boxed{{{row['expected_answer']}}}").reward == 1.0


def test_example_data_validates_and_routes_here():
    assert validate_file(ArithmeticEnvironment.example_data).ok
    tasks = load_tasks(ArithmeticEnvironment.example_data)
    assert tasks and all(get_environment(task.env_name) is ArithmeticEnvironment for task in tasks)
