"""The llm_judge environment with a scripted judge: both orders asked, verdicts combined, failures masked."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from environments.llm_judge import EQUAL, NOT_EQUAL, LLMJudgeEnvironment, extract_answer, parse_verdict
from gym_bridge import BackendError, Engine, EngineConfig, Generation, TextModel, SamplingParams, ScriptedPolicy, configure
from gym_bridge.core.items import message_item
from gym_bridge.core.registry import get_environment
from gym_bridge.core.task import load_tasks, parse_task
from tests.support.invariants import assert_token_invariants

# NeMo Gym's equivalence_llm_judge rows: question, expected_answer, no agent_ref.
ROW = {
    "responses_create_params": {"input": [{"role": "user", "content": "Answer in \\boxed{}.\n\nWho proposed evolution by natural selection?"}]},
    "question": "Who proposed evolution by natural selection?",
    "expected_answer": "darwin",
}


def judge_env(smol_template, script: dict) -> tuple[type[LLMJudgeEnvironment], ScriptedPolicy]:
    policy = ScriptedPolicy(script)
    judge = TextModel(policy, smol_template)
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
        from gym_bridge.cli.eval_engine import _apply_env_options
        from gym_bridge.core.trust import DEFAULT_TRUST

        _apply_env_options(["llm_judge.judge_max_new_tokens=64", "llm_judge.judge_base_url=http://127.0.0.1:9/v1"], [], DEFAULT_TRUST)
        configured = get_environment("llm_judge")
        assert (configured.judge_max_new_tokens, configured.judge_base_url) == (64, "http://127.0.0.1:9/v1")  # JSON, else a string
        with pytest.raises(Exception, match="NAME.KEY=VALUE"):
            _apply_env_options(["llm_judge=3"], [], DEFAULT_TRUST)
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


# -- a judge behind a real server on loopback (issue 19, items 9-11) ----------------------------


def judged_by_server(smol_tokenizer, reply: str):
    """`gym-bridge serve-model`'s app on loopback, answering every judge prompt with `reply`."""
    from gym_bridge.serve.model_server import build_app
    from tests.support.http_server import app_in_thread
    from tests.support.scripted_model import ScriptedModel

    ids = smol_tokenizer.encode(reply, add_special_tokens=False) + [smol_tokenizer.eos_token_id]
    model = ScriptedModel(smol_tokenizer, lambda prompt, request: Generation(token_ids=ids, logprobs=[-0.1] * len(ids), finish_reason="stop"))
    return model, app_in_thread(build_app(model, model_name="served-judge"))


def test_a_judge_server_set_by_base_url_and_model_judges(smol_tokenizer) -> None:
    """Item 9: `judge_base_url` + `judge_model` (the setting docs/environments.md gives for real use) loads a helper over
    `/v1/completions` and judges; it used to mask every sample with a TypeError from unpacking the tokenizer."""
    model, serving = judged_by_server(smol_tokenizer, f"Both name Darwin. {EQUAL}")
    with serving as url:
        env_class = type("ServedJudge", (LLMJudgeEnvironment,), {"judge_base_url": url + "/v1", "judge_model": "served-judge"})
        result = verify(env_class, "It was Charles Darwin.")
    assert (result.reward, result.mask_sample, result.failure_reason) == (1.0, False, None)
    assert result.metrics["verdicts"] == ["equal", "equal"] and len(model.requests) == 2     # both orders, over HTTP
    prompts = [smol_tokenizer.decode(list(request.prompt_ids)) for request in model.requests]
    assert all("ANSWER A:" in prompt and "Who proposed evolution" in prompt for prompt in prompts)


def hanging_judge_server(calls: list[float], release):
    """A server whose `/v1/completions` answers nothing until `release` is set (then a 503)."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    from tests.support.http_server import app_in_thread

    app = FastAPI()

    @app.post("/v1/completions")
    async def completions() -> JSONResponse:
        calls.append(time.monotonic())
        while not release.is_set():
            await asyncio.sleep(0.05)
        return JSONResponse({"error": {"message": "released"}}, status_code=503)

    return app_in_thread(app)


def test_the_judge_timeout_and_retries_are_settings(smol_tokenizer) -> None:
    """Item 11: a hanging judge costs `judge_request_timeout_s` per call, not a fixed 120 s x 4: a timed-out
    request is not retried (the server may still be generating it; a retry would start over), so with
    0.5 s the rollout is masked after about 0.5 s; `judge_max_retries` applies to connection errors and 5xx."""
    calls: list[float] = []
    release = threading.Event()
    with hanging_judge_server(calls, release) as url:
        env_class = type("HangingJudge", (LLMJudgeEnvironment,), {
            "judge_base_url": url + "/v1", "judge_model": "j", "judge_request_timeout_s": 0.5, "judge_max_retries": 1})
        started = time.monotonic()
        result = verify(env_class, "Darwin")
        elapsed = time.monotonic() - started
        release.set()
    assert (result.mask_sample, result.failure_kind) == (True, "verifier")
    assert "request timed out after 0.5 s" in result.failure_reason and "not retried" in result.failure_reason
    assert 1 <= len(calls) <= 2 and elapsed < 10     # one attempt per order (the orders run together), none retried


def test_a_hanging_judge_ends_at_the_rollout_deadline(smol_tokenizer, smol_template, turn) -> None:
    """Item 11: the rollout deadline covers verify: with `deadline_s=1.5` a judge that never answers
    (default timeout and retries: minutes) ends the rollout as a `timeout` failure at the deadline."""
    calls: list[float] = []
    release = threading.Event()
    with hanging_judge_server(calls, release) as url:
        env_class = type("HangingJudge", (LLMJudgeEnvironment,), {"judge_base_url": url + "/v1", "judge_model": "j"})
        policy = ScriptedPolicy({"": [turn("Charles Darwin.")]})
        engine = Engine(policy, smol_template, EngineConfig(sampling=SamplingParams(max_new_tokens=32), deadline_s=1.5))
        task = parse_task(ROW, index=0, default_env="llm_judge")

        async def bounded():
            return await asyncio.wait_for(engine.rollout(task, env_class=env_class), timeout=30)

        started = time.monotonic()
        record = asyncio.run(bounded())
        elapsed = time.monotonic() - started
        release.set()
    assert calls, "the judge was never asked"
    assert (record.failure_kind, record.mask_sample) == ("timeout", True) and "deadline of 1.5 s" in record.failure_reason
    assert elapsed < 10


EVIL_PATTERN = r"Answer:\s*((a|aa)+)$"
"""A nested quantifier: on 'Answer: aaaa...a!' Python's `re` backtracks for minutes (2^n paths)."""


def test_a_catastrophic_answer_regex_is_bounded_and_masked(smol_template) -> None:
    """Item 10: a row's `output_regex` with a nested quantifier and a crafted answer used to run on the
    event loop for as long as it backtracked (44.6 s in the report, here minutes). It now gives up after
    `regex_timeout_s` of matching, masks the sample, and other coroutines keep running meanwhile."""
    env_class, policy = judge_env(smol_template, {"": [said(EQUAL)]})
    env_class = type("QuickRegex", (env_class,), {"regex_timeout_s": 0.3})
    row = {**ROW, "template_metadata": {"output_regex": EVIL_PATTERN}}
    task = parse_task(row, index=0, default_env="equivalence_llm_judge")
    answer = [message_item("Answer: " + "a" * 60 + "!", item_id="msg_1")]

    async def verify_while_ticking():
        ticks: list[float] = []

        async def tick():
            while True:
                ticks.append(time.monotonic())
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        try:
            result = await asyncio.wait_for(env_class().verify(task, answer), timeout=30)
            await asyncio.sleep(0.05)      # the ticker records the gap of a verify that never yielded
            return result, ticks
        finally:
            ticker.cancel()

    started = time.monotonic()
    result, ticks = asyncio.run(verify_while_ticking())
    elapsed = time.monotonic() - started
    assert (result.mask_sample, result.failure_kind) == (True, "verifier") and "regex_timeout_s" in result.failure_reason
    assert policy.calls == [] and elapsed < 15
    assert len(ticks) > 5 and max(b - a for a, b in zip(ticks, ticks[1:])) < 0.5    # the loop was never held


def test_the_bounded_regex_matches_as_before() -> None:
    """Item 10: the `regex` engine extracts what `re` did on ordinary patterns."""
    assert extract_answer("x \\boxed{4} y \\boxed{5}", r"\\boxed\{([^}]*)\}") == "5"
    assert extract_answer("Answer: Paris\nmore\nAnswer: Rome", r"^Answer:\s*(.*?)$") == "Rome"       # MULTILINE
    assert extract_answer("<a>one\ntwo</a>", r"<a>(.*)</a>") == "one\ntwo"                          # DOTALL
    assert extract_answer("no match", r"zzz") == "" and extract_answer("bad [", r"[") == "bad ["
    with pytest.raises(TimeoutError):
        extract_answer("Answer: " + "a" * 60 + "!", EVIL_PATTERN, timeout_s=0.2)
