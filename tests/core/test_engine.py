"""The engine with a scripted policy and the embedded model's real template: token invariants,
failure kinds, bounds and grouping."""

import asyncio
import json
import time

import pytest

from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.environment import Environment
from gym_bridge.core.policy import ScriptedPolicy
from gym_bridge.core.errors import BackendError, ContextOverflowError
from gym_bridge.core.registry import register
from gym_bridge.core.task import parse_task
from tests.support.invariants import assert_token_invariants
from tests.support.lab import call, closed_sessions, task


def run(engine, tasks, repeats=1):
    async def collect():
        return [record async for record in engine.stream(tasks, repeats=repeats)]

    return asyncio.run(collect())


def engine_for(template, script, **config):
    return Engine(ScriptedPolicy(script), template, EngineConfig(**config))


def test_multi_turn_rollout_keeps_the_token_invariants(smol_template, turn, smol_tokenizer):
    script = {"": [turn(call(sample="ab")), turn(call(sample="abc")), turn("All done.")]}
    engine = engine_for(smol_template, script)
    [record] = run(engine, [task()])
    assert record.failure_kind is None and record.reward == 1.0 and record.finish_reason == "answer"
    assert (record.turns, record.tool_calls) == (3, 2)
    assert record.verify_metrics == {"tool_calls_seen": 2}
    assert_token_invariants(record.to_dict())
    types = [item["type"] for item in record.output]
    assert types == ["function_call", "function_call_output", "function_call", "function_call_output", "message"]
    assert json.loads(record.output[1]["output"]) == {"sample": "ab", "value": 2}
    text = smol_tokenizer.decode(record.tokens.completion_ids)
    assert text.count("<|im_start|>tool\n") == 2 and text.endswith("All done.<|im_end|>")
    # Every model call saw exactly the whole stream before it.
    policy_calls = engine.policy.calls
    assert [list(c.prompt_ids) for c in policy_calls] == [
        item["prompt_token_ids"] for item in record.output if "prompt_token_ids" in item
    ]


def test_policy_mistakes_are_scored_not_failed(smol_template, turn):
    script = {"": [
        turn('<tool_call>{"name": "measure", "arguments": {"sample": }</tool_call>'),  # bad JSON
        turn(call(name="weigh", sample="a")),  # unknown tool
        turn(call(sample=5)),  # wrong argument type
        turn(call(sample="missing")),  # the tool's own error for the model
        turn("I give up."),
    ]}
    [record] = run(engine_for(smol_template, script), [task()])
    assert record.failure_kind is None and record.mask_sample is False and record.reward == 0.0
    errors = [json.loads(item["output"])["error"] for item in record.output if item["type"] == "function_call_output"]
    assert "malformed tool call" in errors[0]
    assert "unknown tool 'weigh'" in errors[1]
    assert "invalid arguments for measure: sample" in errors[2]
    assert errors[3] == "no such sample"
    assert_token_invariants(record.to_dict())


@pytest.mark.parametrize(
    ("sample", "kind", "reason"),
    [("crash", "env", "tool 'measure' raised RuntimeError: instrument broke"),
     ("hang", "env", "tool 'measure' did not return within 0.5 s"),
     ("weird", "env", "not JSON-serializable")],
)
def test_environment_failures_are_masked_records(smol_template, turn, sample, kind, reason):
    [record] = run(engine_for(smol_template, {"": [turn(call(sample=sample)), turn("done")]}), [task()])
    assert record.failure_kind == kind and reason in record.failure_reason
    assert record.mask_sample is True and record.reward == 0.0 and record.finish_reason == "failed"
    assert_token_invariants(record.to_dict())


@pytest.mark.parametrize(("mode", "reason"), [("verify_crash", "verify raised ValueError: bad verifier"),
                                               ("verify_hang", "verify did not return within 0.5 s")])
def test_verifier_failures(smol_template, turn, mode, reason):
    closed_sessions.clear()
    [record] = run(engine_for(smol_template, {"": [turn("done")]}), [task(mode=mode)])
    assert (record.failure_kind, record.failure_reason, record.mask_sample) == ("verifier", reason, True)
    assert closed_sessions == [mode]  # the session is closed even when verify failed


def test_backend_errors_fail_only_the_affected_rollouts(smol_template, turn):
    script = {"0-0": [BackendError("connection refused")], "1-0": [ContextOverflowError("prompt too long")],
              "": [turn("done")]}
    records = sorted(run(engine_for(smol_template, script), [task(0), task(1), task(2)]), key=lambda r: r.task_index)
    assert [(r.failure_kind, r.mask_sample) for r in records] == [("infra", True), ("context_overflow", True), (None, False)]
    assert "connection refused" in records[0].failure_reason
    assert records[2].reward == 1.0


def test_deadline_bounds_a_rollout(smol_template, turn):
    class SlowPolicy(ScriptedPolicy):
        async def generate(self, request):
            await asyncio.sleep(10)

    engine = Engine(SlowPolicy({}), smol_template, EngineConfig(deadline_s=0.2))
    started = time.perf_counter()
    [record] = run(engine, [task()])
    assert time.perf_counter() - started < 2
    assert record.failure_kind == "timeout" and "deadline of 0.2 s" in record.failure_reason


def test_limits_end_the_episode_and_are_scored(smol_template, turn):
    endless = {"": [turn(call(sample="a"))] * 10}
    [record] = run(engine_for(smol_template, endless, limits=Limits(max_turns=3)), [task()])
    assert (record.finish_reason, record.turns, record.failure_kind) == ("max_turns", 3, None)
    # The last turn's tool output is recorded but no tokens follow the final model turn.
    assert record.tokens.completion_mask[-1] == 1
    assert_token_invariants(record.to_dict())

    [record] = run(engine_for(smol_template, endless, limits=Limits(max_turns=10, max_completion_tokens=80)), [task()])
    assert record.finish_reason == "budget" and record.failure_kind is None
    assert len(record.tokens.completion_ids) <= 80
    assert_token_invariants(record.to_dict())

    cut = {"": [turn("I was cut", eos=False, finish_reason="length")]}
    [record] = run(engine_for(smol_template, cut), [task()])
    assert record.finish_reason == "length" and record.failure_kind is None


def test_groups_stay_together_and_in_order(smol_template, turn):
    engine = engine_for(smol_template, {"": [turn("done")]}, max_concurrency=3)
    groups = asyncio.run(engine.run_groups([task(i) for i in range(4)], group_size=3))
    assert [[(r.task_index, r.repeat_index) for r in group] for group in groups] == [
        [(i, 0), (i, 1), (i, 2)] for i in range(4)
    ]


def test_concurrency_is_bounded(smol_template, turn):
    in_flight, peak = 0, 0

    class CountingPolicy(ScriptedPolicy):
        async def generate(self, request):
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            await asyncio.sleep(0.01)
            in_flight -= 1
            return await super().generate(request)

    engine = Engine(CountingPolicy({"": [turn("done")]}), smol_template, EngineConfig(max_concurrency=4))
    assert len(run(engine, [task(i) for i in range(20)])) == 20
    assert peak == 4


def test_stream_skips_finished_pairs(smol_template, turn):
    engine = engine_for(smol_template, {"": [turn("done")]})

    async def collect():
        return [(r.task_index, r.repeat_index) async for r in engine.stream([task(0), task(1)], repeats=2, skip={(0, 1), (1, 0)})]

    assert sorted(asyncio.run(collect())) == [(0, 0), (1, 1)]


def test_template_check_modes(smol_tokenizer, turn):
    from tests.core.template.test_template import DROPS_REASONING_TEMPLATE, TemplatedTokenizer
    from gym_bridge.core.errors import TemplateError
    from gym_bridge.core.template.chat_template import ChatTemplate

    rewriting = ChatTemplate(TemplatedTokenizer(smol_tokenizer, DROPS_REASONING_TEMPLATE))
    with pytest.raises(TemplateError):
        Engine(ScriptedPolicy({}), rewriting, EngineConfig())
    with pytest.warns(UserWarning, match="not append-only"):
        Engine(ScriptedPolicy({}), rewriting, EngineConfig(template_check="warn"))
    with pytest.raises(ValueError, match="template_check must be"):
        Engine(ScriptedPolicy({}), rewriting, EngineConfig(template_check="maybe"))


def test_verify_returning_nonsense_is_a_verifier_failure(smol_template, turn):
    @register
    class Odd(Environment):
        name = "odd_verify_for_engine_test"

        def verify(self, task, output):
            return "yes"

    [record] = run(engine_for(smol_template, {"": [turn("done")]}), [parse_task({"prompt": "x", "environment": Odd.name}, index=0)])
    assert record.failure_kind == "verifier" and "verify returned str" in record.failure_reason
