"""The llm_judge environment with a scripted judge: both orders asked, verdicts combined, failures masked."""

from __future__ import annotations

import asyncio

import pytest

from environments.llm_judge import EQUAL, NOT_EQUAL, LLMJudgeEnvironment, extract_answer, parse_verdict
from gym_bridge import BackendError, Engine, EngineConfig, Generation, HelperModel, SamplingParams, ScriptedPolicy, configure
from gym_bridge.core.items import message_item
from gym_bridge.core.registry import get_environment
from gym_bridge.core.task import load_tasks, parse_task
from tests.invariants import assert_token_invariants

# NeMo Gym's equivalence_llm_judge rows: question, expected_answer, no agent_ref.
ROW = {
    "responses_create_params": {"input": [{"role": "user", "content": "Answer in \\boxed{}.\n\nWho proposed evolution by natural selection?"}]},
    "question": "Who proposed evolution by natural selection?",
    "expected_answer": "darwin",
}


def judge_env(smol_template, script: dict) -> tuple[type[LLMJudgeEnvironment], ScriptedPolicy]:
    policy = ScriptedPolicy(script)
    judge = HelperModel(policy, smol_template)
    return type("ScriptedJudge", (LLMJudgeEnvironment,), {"judge": judge}), policy


def said(text: str) -> Generation:
    return Generation(token_ids=[1, 2], logprobs=[0.0, 0.0], finish_reason="stop", text=text)


def verify(env_class, answer: str, row: dict = ROW):
    task = parse_task(row, index=0, default_env="equivalence_llm_judge")
    return asyncio.run(env_class().verify(task, [message_item(answer, item_id="msg_1")]))


def test_equal_in_both_orders_earns_1_and_both_orders_are_asked(smol_template, smol_tokenizer) -> None:
    env_class, policy = judge_env(smol_template, {"judge-0-ab": [said(f"Same person. {EQUAL}")], "judge-0-ba": [said(f"Yes {EQUAL}")]})
    result = verify(env_class, "It was Charles Darwin.")
    assert result.reward == 1.0 and result.metrics["verdicts"] == ["equal", "equal"]
    prompts = {call.session_id: smol_tokenizer.decode(call.prompt_ids) for call in policy.calls}
    assert prompts["judge-0-ab"].index("ANSWER A:\ndarwin") < prompts["judge-0-ab"].index("ANSWER B:\nIt was Charles Darwin.")
    assert prompts["judge-0-ba"].index("ANSWER A:\nIt was Charles Darwin.") < prompts["judge-0-ba"].index("ANSWER B:\ndarwin")
    assert "Who proposed evolution by natural selection?" in prompts["judge-0-ab"]


def test_not_equal_in_either_order_earns_0(smol_template) -> None:
    for first, second in ((EQUAL, NOT_EQUAL), (NOT_EQUAL, EQUAL), (NOT_EQUAL, NOT_EQUAL)):
        env_class, _ = judge_env(smol_template, {"judge-0-ab": [said(first)], "judge-0-ba": [said(second)]})
        result = verify(env_class, "Lamarck")
        assert result.reward == 0.0 and not result.mask_sample, (first, second)


def test_judge_failures_are_masked_verifier_failures(smol_template) -> None:
    for script in (
        {"judge-0-ab": [said(EQUAL)], "judge-0-ba": [BackendError("judge server down")]},
        {"judge-0-ab": [said("I am not sure.")], "judge-0-ba": [said(EQUAL)]},   # no verdict at all
    ):
        env_class, _ = judge_env(smol_template, script)
        result = verify(env_class, "Darwin")
        assert (result.reward, result.mask_sample, result.failure_kind) == (0.0, True, "verifier")
        assert "judge failed" in result.failure_reason


def test_empty_answer_is_0_without_asking_the_judge(smol_template) -> None:
    env_class, policy = judge_env(smol_template, {})
    result = verify(env_class, "   ")
    assert result.reward == 0.0 and not result.mask_sample and policy.calls == []


def test_row_without_expected_answer_is_a_masked_verifier_failure(smol_template) -> None:
    env_class, _ = judge_env(smol_template, {})
    row = {key: value for key, value in ROW.items() if key != "expected_answer"}
    result = verify(env_class, "Darwin", row)
    assert result.mask_sample and result.failure_kind == "verifier" and "expected_answer" in result.failure_reason


def test_verdict_parsing_and_answer_extraction() -> None:
    assert parse_verdict(f"They match. {EQUAL} they are equivalent") is True
    assert parse_verdict(f"Not {EQUAL}? No: {NOT_EQUAL}") is False          # the final verdict counts
    with pytest.raises(Exception, match="neither"):
        parse_verdict("maybe")
    assert extract_answer("so \\boxed{4} or \\boxed{5}", r"\\boxed\{([^}]*)\}") == "5"
    assert extract_answer("no box here", r"\\boxed\{([^}]*)\}") == ""
    assert extract_answer("  plain  ", None) == "plain"


def test_per_row_output_regex_picks_what_is_judged(smol_template, smol_tokenizer) -> None:
    env_class, policy = judge_env(smol_template, {"": [said(EQUAL)]})
    row = {**ROW, "template_metadata": {"output_regex": r"Answer:\s*(.*)"}}
    assert verify(env_class, "Long reasoning...\nAnswer: Darwin", row).metrics["extracted_answer"] == "Darwin"
    assert "Long reasoning" not in smol_tokenizer.decode(policy.calls[0].prompt_ids)


def test_rollout_through_the_engine_with_a_scripted_judge(smol_template, turn) -> None:
    env_class, _ = judge_env(smol_template, {"": [said(EQUAL)]})
    task = parse_task(ROW, index=0, default_env="llm_judge")
    policy = ScriptedPolicy({"": [turn("Charles Darwin.")]})
    engine = Engine(policy, smol_template, EngineConfig(sampling=SamplingParams(max_new_tokens=32)))
    record = asyncio.run(engine.rollout(task, env_class=env_class))
    assert record.reward == 1.0 and record.verify_metrics["verdicts"] == ["equal", "equal"]
    assert_token_invariants(record.to_dict())


def test_settings_come_from_configure_and_are_checked() -> None:
    original = get_environment("llm_judge")
    try:
        configured = configure("llm_judge", judge_base_url="http://127.0.0.1:9/v1", judge_model="judge", judge_api="chat")
        assert get_environment("equivalence_llm_judge") is configured and configured.judge_api == "chat"
        configured.check_ready()
        with pytest.raises(Exception, match="judge_api"):
            configure("llm_judge", judge_api="telepathy").check_ready()
        with pytest.raises(Exception, match="has no setting 'judge_colour'"):
            configure("llm_judge", judge_colour="red")
        from gym_bridge.cli import _apply_env_options

        _apply_env_options(["llm_judge.judge_max_new_tokens=64", "llm_judge.judge_base_url=http://127.0.0.1:9/v1"], [])
        configured = get_environment("llm_judge")
        assert (configured.judge_max_new_tokens, configured.judge_base_url) == (64, "http://127.0.0.1:9/v1")  # JSON, else a string
        with pytest.raises(Exception, match="NAME.KEY=VALUE"):
            _apply_env_options(["llm_judge=3"], [])
    finally:
        from gym_bridge.core.registry import register

        register(original)


def test_example_rows_route_here() -> None:
    tasks = load_tasks(LLMJudgeEnvironment.example_data)
    assert len(tasks) >= 10 and all(task.get("expected_answer") for task in tasks)
    assert {get_environment(task.env_name) for task in tasks} == {LLMJudgeEnvironment}


@pytest.mark.slow
def test_the_embedded_model_as_judge_gives_a_verdict_or_a_masked_failure() -> None:
    """The default judge (embedded SmolLM2-135M): too small to judge well, so this checks the plumbing."""
    env_class = type("ShortJudge", (LLMJudgeEnvironment,), {"judge_max_new_tokens": 48})
    result = verify(env_class, "Charles Darwin")
    if result.mask_sample:
        assert result.failure_kind == "verifier" and "judge failed" in result.failure_reason
    else:
        assert result.reward in (0.0, 1.0) and len(result.metrics["verdicts"]) == 2
        assert all(reply for reply in result.metrics["judge_replies"])
