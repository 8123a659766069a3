"""`env check` runs its scripted calls through the rollout's own tool dispatch, with the engine's limits: what it
prints for a call is what a rollout's record holds for it (it used to copy the dispatch, with a fixed 100,000-character cut)."""

import asyncio

from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.environment import Environment, VerifyResult, tool
from gym_bridge.core.policy import SamplingParams, ScriptedPolicy
from gym_bridge.core.registry import register
from gym_bridge.core.task import parse_task
from gym_bridge.data.task_files import write_rows
from gym_bridge.eval.env_check import ScriptedCall, check_environment


@register
class Lister(Environment):
    name = "lister_for_env_check_test"

    @tool
    def listing(self, count: int) -> list:
        """The numbers below count."""
        return list(range(count))

    def verify(self, task, output):
        return VerifyResult(reward=1.0)


CALL = '<tool_call>\n{"name": "listing", "arguments": {"count": 2000}}\n</tool_call>'
LIMITS = Limits(max_tool_output_chars=200, max_completion_tokens=4096)


def _checked(tmp_path, calls):  # type: ignore[no-untyped-def]
    rows = write_rows([{"prompt": "Count.", "environment": Lister.name}], tmp_path / "rows.jsonl")
    lines: list[str] = []
    problems = asyncio.run(check_environment(Lister.name, data_paths=[str(rows)], calls=calls, answer="done", limits=LIMITS,
                                             out=lines.append))
    return problems, lines


def test_a_tool_output_over_the_limit_is_cut_as_a_rollout_cuts_it(tmp_path, smol_template, turn):
    problems, lines = _checked(tmp_path, [ScriptedCall("listing", {"count": 2000})])
    engine = Engine(ScriptedPolicy({"": [turn(CALL), turn("done")]}),
                    smol_template, EngineConfig(sampling=SamplingParams(max_new_tokens=64), limits=LIMITS))
    record = asyncio.run(engine.rollout(parse_task({"prompt": "Count.", "environment": Lister.name}, index=0), env_class=Lister))
    read = next(item["output"] for item in record.output if item["type"] == "function_call_output")
    # 2000 numbers are about 9,900 characters of JSON: the old copy cut at 100,000, so it printed them whole
    assert "more than 200 characters; only the first 200 are shown" in read
    assert problems == 0
    assert f'  call listing({{"count": 2000}}) -> {read.replace(chr(10), chr(92) + "n")}' in lines


def test_a_call_of_a_tool_the_row_does_not_offer_is_a_problem_with_the_rollouts_answer(tmp_path):
    problems, lines = _checked(tmp_path, [ScriptedCall("lookup", {})])
    assert problems == 1
    assert "  call lookup({}) -> PROBLEM: the row offers no tool 'lookup' (its tools: ['listing'])" in lines
