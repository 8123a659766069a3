"""Every model family works token-exact: the real chat templates of ../shared/templates (skipped
when the folder is absent) and small self-written ones reproducing each behaviour.

Per family: the parsers and the append-only verdict are right; scripted multi_step rollouts with
three tool calls written in the family's own syntax parse into function_call items and reach the
answer with reward 1; the token invariants hold; for append-only families each model call's
prompt text is exactly the template's own rendering of the structured conversation so far.
"""

import asyncio
import json

import pytest

from gym_bridge import Engine, EngineConfig, ScriptedPolicy, get_environment, load_tasks
from gym_bridge.core.errors import TemplateError
from gym_bridge.core.template.chat_template import ChatTemplate
from gym_bridge.core.template.check import template_report
from tests.support.families import (
    MINI_FAMILIES, REAL_FAMILIES, REASONING, SHARED_TEMPLATES, TEMPLATES_MISSING, family_tokenizer, prompt_mismatches, run_scripted, scripted_turns,
    written_id,
)
from tests.support.invariants import assert_token_invariants

real_present = pytest.mark.skipif(not SHARED_TEMPLATES.is_dir(), reason=TEMPLATES_MISSING)
FAMILIES = [pytest.param(f, id=f.label, marks=real_present) for f in REAL_FAMILIES] + [
    pytest.param(f, id=f.label) for f in MINI_FAMILIES]

@pytest.fixture(scope="module")
def templates(smol_tokenizer):
    cache = {}

    def get(family):
        if family.label not in cache:
            tokenizer, eos_ids = family_tokenizer(smol_tokenizer, family)
            cache[family.label] = (tokenizer, ChatTemplate(tokenizer, eos_token_ids=eos_ids))
        return cache[family.label]

    return get


@pytest.mark.parametrize("family", FAMILIES)
def test_parsers_and_verdict(family, templates):
    tokenizer, template = templates(family)
    report = template_report(template)
    assert (report.tool_parser, report.reasoning_parser) == (family.tool_parser, family.reasoning_parser)
    assert template.profile.style.tool_calls is not family.raw_turns, template.profile.style
    assert report.end_of_turn == family.eos  # the true end of an answer, not the first id of the generation config's list
    assert tokenizer.convert_ids_to_tokens(template.end_of_turn_id) == family.eos
    assert report.append_only is family.append_only, report.summary()
    if family.append_only:
        Engine(ScriptedPolicy({}), template, EngineConfig(template_check="error"))
    else:
        with pytest.raises(TemplateError, match=r"(?s)not append-only .*template_check='warn'"):
            Engine(ScriptedPolicy({}), template, EngineConfig(template_check="error"))


@pytest.mark.parametrize("family", FAMILIES)
def test_scripted_tool_calls_reach_the_answer_token_exact(family, templates):
    tokenizer, template = templates(family)
    calls, _ = scripted_turns(family, tokenizer)
    for record in run_scripted(family, tokenizer, template):
        row = record.to_dict()
        assert record.failure_kind is None, record.failure_reason
        assert (record.reward, record.finish_reason, record.turns, record.tool_calls) == (1.0, "answer", 4, 3)
        assert row["metrics"]["parse_errors"] == 0 and row["metrics"]["unparsed_tool_calls"] == 0
        function_calls = [item for item in record.output if item["type"] == "function_call"]
        assert [(item["name"], json.loads(item["arguments"])) for item in function_calls] == calls
        outputs = [item for item in record.output if item["type"] == "function_call_output"]
        assert [item["call_id"] for item in outputs] == [item["call_id"] for item in function_calls]
        if family.writes_ids:  # the ids the model wrote are the ids rendered back to it
            assert [item["call_id"] for item in function_calls] == [written_id(index) for index in range(3)]
        if family.reason:
            assert [item["summary"][0]["text"] for item in record.output if item["type"] == "reasoning"] == [REASONING] * 4
        assert_token_invariants(row)
        if family.append_only:  # every call's prompt is the template's own rendering of the conversation so far
            assert prompt_mismatches(record, template, tokenizer) == []


def test_unreadable_and_foreign_calls_are_counted_and_scored(smol_template, turn):
    """A malformed call is shown to the model as an error and counted; a call in another family's syntax
    ends the rollout as an answer (scored 0) and is counted, in the record and in the eval summary."""
    from gym_bridge.core.metrics import summarize

    script = {
        "0-0": [turn('<tool_call>\n{"name": "get_synonym_value", "arguments": {"synonym": }\n</tool_call>'), turn("Done.")],
        "0-1": [turn('[TOOL_CALLS][{"name": "get_synonym_value", "arguments": {"synonym": "Warm"}}]')],
    }
    engine = Engine(ScriptedPolicy(script), smol_template, EngineConfig())
    tasks = load_tasks(get_environment("multi_step").example_data, limit=1)

    async def run():
        return sorted([record async for record in engine.stream(tasks, repeats=2)], key=lambda r: r.repeat_index)

    malformed, foreign = asyncio.run(run())
    assert (malformed.parse_errors, malformed.unparsed_tool_calls, malformed.turns) == (1, 0, 2)
    assert "malformed tool call" in next(item["output"] for item in malformed.output if item["type"] == "function_call_output")
    assert (foreign.parse_errors, foreign.unparsed_tool_calls, foreign.turns, foreign.reward) == (0, 1, 1, 0.0)
    assert foreign.finish_reason == "answer" and foreign.failure_kind is None  # the policy's mistake: scored, not a failure
    rows = [record.to_dict() for record in (malformed, foreign)]
    assert [row["metrics"]["parse_errors"] for row in rows] == [1, 0] and [row["metrics"]["unparsed_tool_calls"] for row in rows] == [0, 1]
    summary = summarize(rows)
    assert (summary["parse_errors"], summary["unparsed_tool_calls"]) == (1, 1)
    assert summary["per_env"]["multi_step"]["unparsed_tool_calls"] == 1
