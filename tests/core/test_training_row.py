"""The training-row rules every trainer adapter shares (`core.training_row.to_training_row`)."""

import dataclasses

import pytest

from gym_bridge.core.training_row import to_training_row
from gym_bridge.core.record import RolloutRecord
from gym_bridge.core.task import parse_task
from gym_bridge.core.trajectory import TokenView

EOS, END_OF_TURN = 2, 7


def _record(*, completion=(10, 11, 12), mask=(1, 1, 0), finish_reason="answer", mask_sample=False,
            failure_kind=None, reward=1.0, segments=()):
    task = parse_task({"prompt": "2+2?", "environment": "math", "expected_answer": "4"}, index=0)
    tokens = TokenView(prompt_ids=[1, 5], completion_ids=list(completion), completion_mask=list(mask),
                       completion_logprobs=[-0.5 * m for m in mask], segments=segments)
    return RolloutRecord(
        task=task, repeat_index=0, env="math", output=[], tokens=tokens, reward=reward, reward_components={"format": 0.5},
        mask_sample=mask_sample, failure_kind=failure_kind, failure_reason=None if failure_kind is None else "boom",
        finish_reason=finish_reason, turns=2, tool_calls=1, latency_s=0.1,
    )


def test_scored_row_keeps_mask_reward_and_metadata():
    row = to_training_row(_record(completion=(10, 11, EOS), mask=(1, 1, 1)), max_completion_length=8, eos_token_ids=[END_OF_TURN, EOS])
    assert row.prompt_ids == (1, 5)
    assert row.completion_ids == (10, 11, EOS)  # EOS already there (any of the ids counts): nothing appended
    assert row.completion_mask == (1, 1, 1)
    assert row.completion_logprobs == (-0.5, -0.5, -0.5)
    assert (row.reward, row.reward_components, row.masked) == (1.0, {"format": 0.5}, False)
    assert (row.env_name, row.turns, row.tool_calls, row.finish_reason, row.harness_rewrites) == ("math", 2, 1, "answer", 0)


@pytest.mark.parametrize("failure_kind", [None, "env_error"])
def test_masked_row_has_all_zero_mask_and_no_reward(failure_kind):
    record = _record(mask_sample=True, failure_kind=failure_kind, finish_reason="failed" if failure_kind else "answer")
    row = to_training_row(record, max_completion_length=8, eos_token_ids=[EOS])
    assert row.masked and row.reward is None and row.reward_components == {}
    assert set(row.completion_mask) == {0}
    assert row.completion_ids[:3] == (10, 11, 12)  # the tokens stay
    assert row.failure_kind == failure_kind


def test_finished_episode_gets_the_first_eos_id_appended_untrained():
    row = to_training_row(_record(), max_completion_length=8, eos_token_ids=[END_OF_TURN, EOS])
    assert row.completion_ids == (10, 11, 12, END_OF_TURN)
    assert row.completion_mask == (1, 1, 0, 0)
    assert row.completion_logprobs[-1] == 0.0


@pytest.mark.parametrize("finish_reason, budget", [("length", 8), ("answer", 3)])
def test_no_eos_appended_when_cut_or_at_the_budget(finish_reason, budget):
    # 3 completion tokens: at a budget of 3 there is no room for an EOS; a `length` finish is not an end
    row = to_training_row(_record(finish_reason=finish_reason), max_completion_length=budget, eos_token_ids=[EOS])
    assert row.completion_ids == (10, 11, 12)
    assert len(row.completion_ids) <= budget


def test_empty_completion_becomes_one_untrained_eos():
    row = to_training_row(_record(completion=(), mask=()), max_completion_length=8, eos_token_ids=[EOS])
    assert (row.completion_ids, row.completion_mask, row.completion_logprobs) == ((EOS,), (0,), (0.0,))


def test_harness_rewrites_count_the_segments_before_the_last():
    record = _record()
    segment = record.tokens
    record = dataclasses.replace(record, tokens=dataclasses.replace(segment, segments=(segment, segment, segment)))
    assert to_training_row(record, max_completion_length=8, eos_token_ids=[EOS]).harness_rewrites == 2


def test_no_eos_ids_is_an_error():
    with pytest.raises(ValueError, match="at least one EOS"):
        to_training_row(_record(), max_completion_length=8, eos_token_ids=[])
