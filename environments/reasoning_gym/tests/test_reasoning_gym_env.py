"""reasoning_gym: answer extraction, the package's own scores (right, wrong, partial), rows and generation."""

from __future__ import annotations

import asyncio
import time

import pytest

import environments.reasoning_gym as rg_env
from environments.reasoning_gym import ReasoningGymEnvironment as RG
from environments.reasoning_gym import extract_answer
from gym_bridge.core.environment import VerifyResult
from gym_bridge.core.items import message_item, reasoning_item
from gym_bridge.core.registry import register, resolve_tasks
from gym_bridge.core.task import load_tasks, parse_task

pytest.importorskip("reasoning_gym", reason="install gym-bridge[environments]")

TASKS = ("chain_sum", "spell_backward", "knights_knaves", "word_sorting")


def grade_all(pairs: list[tuple[dict, str]]) -> list[VerifyResult]:
    """Verify many (row, answer text) pairs in one event loop (one worker pool warm-up)."""
    async def run() -> list[VerifyResult]:
        env = RG()
        return await asyncio.gather(*(env.verify(parse_task(row, index=0, default_env="reasoning_gym"),
                                                 [message_item(text, item_id="m")]) for row, text in pairs))

    return asyncio.run(run())


def test_extraction_prefers_answer_tags_then_the_last_box_then_the_text() -> None:
    assert extract_answer("<answer>1</answer> and <answer> 2 </answer> \\boxed{3}") == "2"
    assert extract_answer("so \\boxed{3} or \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert extract_answer("  just 42 \n") == "just 42"
    assert extract_answer("<answer>unclosed") == "<answer>unclosed"


def test_the_packages_scorer_gives_right_wrong_and_partial_credit() -> None:
    rows = {name: RG.prepare_rows(split="train", size=1, seed=7, task=name)[0] for name in TASKS}
    sorted_words = rows["word_sorting"]["answer"]
    cases = [(rows[name], f"Thinking...\n<answer>{rows[name]['answer']}</answer>", 1.0) for name in TASKS]
    cases += [(rows["chain_sum"], "<answer>123456789</answer>", 0.0),
              (rows["chain_sum"], f"\\boxed{{{rows['chain_sum']['answer']}}}", 1.0),      # boxed fallback
              (rows["chain_sum"], rows["chain_sum"]["answer"], 1.0),                       # bare text fallback
              (rows["spell_backward"], "<answer></answer>", 0.0),
              (rows["word_sorting"], f"<answer>{sorted_words.upper()}</answer>", None)]  # partial: between 0 and 1
    results = grade_all([(row, text) for row, text, _ in cases])
    for (row, text, expected), result in zip(cases, results):
        assert not result.mask_sample, result.failure_reason
        if expected is None:
            assert 0.0 < result.reward < 1.0, (text, result.reward)
        else:
            assert result.reward == expected, (row["metadata"]["source_dataset"], text, result.reward)
        assert result.reward_components == {"score": result.reward}
        assert result.metrics["task_name"] == row["metadata"]["source_dataset"]


def test_bad_model_output_is_scored_not_crashed() -> None:
    row = RG.prepare_rows(split="train", size=1, seed=1, task="knights_knaves")[0]
    results = grade_all([(row, ""), (row, "\x00" * 100), (row, "<answer>" + "x" * 10000 + "</answer>")])
    assert [(r.reward, r.mask_sample) for r in results] == [(0.0, False)] * 3


def test_a_nemo_gym_row_loads_and_scores_like_the_package() -> None:
    # NeMo Gym's example rows: the question as the only input, no routing (so --env), metadata.source_dataset
    row = RG.prepare_rows(split="train", size=1, seed=2, task="chain_sum")[0]
    nemo_row = {"responses_create_params": {"input": [{"role": "user", "content": row["question"]}]},
                "question": row["question"], "answer": row["answer"], "metadata": row["metadata"]}
    assert RG.validate_row(nemo_row) == []
    output = [reasoning_item("adding", item_id="r"), message_item(f"<answer>{row['answer']}</answer>", item_id="m")]
    result = asyncio.run(RG().verify(parse_task(nemo_row, index=0, default_env="reasoning_gym_simple_agent"), output))
    assert result.reward == 1.0


def test_prepare_rows_is_seeded_splits_differ_and_errors_name_the_fix() -> None:
    train = RG.prepare_rows(split="train", size=6, seed=0, task="chain_sum,leg_counting")
    assert train == RG.prepare_rows(split="train", size=6, seed=0, task="chain_sum,leg_counting")
    assert [r["metadata"]["source_dataset"] for r in train] == ["chain_sum"] * 3 + ["leg_counting"] * 3
    validation = RG.prepare_rows(split="validation", size=6, seed=0, task="chain_sum,leg_counting")
    assert {r["question"] for r in train}.isdisjoint({r["question"] for r in validation})
    assert all(RG.validate_row(r) == [] for r in train)
    with pytest.raises(ValueError, match="needs --task"):
        RG.prepare_rows(split="train", size=1, seed=0)
    with pytest.raises(ValueError, match="known: .*chain_sum"):
        RG.prepare_rows(split="train", size=1, seed=0, task="chain_summ")


def test_example_rows_route_and_their_answers_score_1() -> None:
    register(RG)
    tasks = load_tasks(RG.example_data)
    assert len(tasks) >= 10 and resolve_tasks(tasks) == {"reasoning_gym": RG}
    results = grade_all([(task.row, f"<answer>{task.get('answer')}</answer>") for task in tasks])
    assert [r.reward for r in results] == [1.0] * len(tasks)


def hang(task_name: str, answer: str, entry: dict) -> float:
    """Stands in for a scorer that never returns."""
    time.sleep(60)
    return 1.0


def test_unscorable_rows_and_hung_scorers_are_masked_verifier_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    row = RG.prepare_rows(split="train", size=1, seed=2, task="chain_sum")[0]
    unknown = {**row, "metadata": {**row["metadata"], "source_dataset": "no_such_task"}}
    assert [p.field for p in RG.validate_row(unknown)] == ["metadata.source_dataset"]
    assert [p.field for p in RG.validate_row({"question": "q"})] == ["answer", "metadata"]
    [result] = grade_all([(unknown, "<answer>1</answer>")])
    assert (result.mask_sample, result.failure_kind) == (True, "verifier")
    monkeypatch.setattr(rg_env, "score_answer", hang)
    monkeypatch.setattr(RG, "check_timeout_s", 0.5)
    [result] = grade_all([(row, "<answer>1</answer>")])
    assert (result.mask_sample, result.failure_kind, result.failure_reason) == (True, "verifier", "scorer timed out after 0.5 s")
