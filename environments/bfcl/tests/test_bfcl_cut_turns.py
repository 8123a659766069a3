"""A model call cut at its token limit goes on as BFCL's own runner goes on: the turn is over unless the cut text still
gives calls that parse, the next user turn follows, the record stays token-exact, and BFCL's checker sees every turn."""

from __future__ import annotations

import json
from typing import Any

from environments.bfcl import BfclMultiTurnEnvironment, turns_of
from environments.bfcl.tests.conformance import needs_bfcl, reference_script, run_rows
from gym_bridge.core.policy import Generation
from gym_bridge.core.transcript import answer_turn, read_turn
from tests.support.families import prompt_mismatches
from tests.support.invariants import assert_token_invariants

pytestmark = needs_bfcl

ROW = {row["bfcl"]["id"]: row for row in map(json.loads, BfclMultiTurnEnvironment.example_data.read_text().splitlines())}["multi_turn_base_0"]
STEP_LIMIT = 20
"""BFCL's MAXIMUM_STEP_LIMIT (bfcl_eval/constants/default_prompts.py)."""


def cut(smol_tokenizer: Any, text: str) -> Generation:
    """A model call stopped at its token limit: `text`'s tokens, no end-of-turn token, finish `length`."""
    ids = smol_tokenizer.encode(text, add_special_tokens=False)
    return Generation(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="length")


def user_turns(record: Any) -> list[list[dict[str, Any]]]:
    """The record's items split at the user messages the environment sent: one list per BFCL turn."""
    turns: list[list[dict[str, Any]]] = [[]]
    for item in record.output:
        if item["type"] == "message" and item.get("role") == "user":
            turns.append([])
        else:
            turns[-1].append(item)
    return turns


def server_answer(template: Any, generation: Generation, tools: list[dict[str, Any]]) -> Any:
    """What BFCL's function-calling handler reads of one model call served by `gym-bridge serve-model` (its
    `answer_turn` rule, as vLLM's tool parsers: calls only when all parse): `[{name: arguments}]` from the answer's
    `tool_calls`, else the answer's text (`OpenAICompletionsHandler._parse_query_response_FC`)."""
    parsed, text, _ = read_turn(template, generation.token_ids, text=None, prompt_ids=[], tools=tools)
    answered = answer_turn(parsed, text, tools_offered=True, call_id=lambda n, call: f"call_{n}")
    return [{call.name: call.arguments} for call in answered.calls] if answered.calls else answered.text


def bfcl_runner_result(answers: list[Any], turn_count: int) -> list[list[Any]]:
    """The model result BFCL's runner records for these answers, by its rule (`BaseHandler.inference_multi_turn_FC`
    in bfcl_eval/model_handler/base_handler.py): per user turn, every model call's answer is a step; an answer that
    decodes to calls (`convert_to_function_call`: each argument string a JSON object) is executed and the turn goes
    on, text or no call ends the turn (the finish reason is never read); more than STEP_LIMIT executed steps
    force-quit the entry (no later turns)."""
    pending, result = iter(answers), []
    for _ in range(turn_count):
        steps, executed = [], 0
        while True:
            answer = next(pending)
            steps.append(answer)
            if not isinstance(answer, list) or not answer or not all(_json_object(arguments) for call in answer for arguments in call.values()):
                break
            executed += 1
            if executed > STEP_LIMIT:
                return [*result, steps]
        result.append(steps)
    return result


def _json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def test_a_cut_answer_ends_its_turn_and_the_next_user_turn_follows_token_exact(smol_template, smol_tokenizer, turn) -> None:
    script = reference_script(ROW, turn)
    assert script[1].finish_reason == "stop"  # turn 0: its calls, then "Done."
    script[1] = cut(smol_tokenizer, "I have moved the file and created the dire")  # the answer cut at its token limit
    [record] = run_rows([ROW], [script], smol_template)
    assert record.failure_kind is None, record.failure_reason
    turns = user_turns(record)
    assert len(turns) == 1 + len(ROW["bfcl"]["turns"])  # every BFCL turn's user message was sent (before: only turn 0 ran)
    assert record.turns == len(script) and record.finish_reason == "answer"
    assert (record.reward, record.verify_metrics["bfcl_error_type"]) == (1.0, "")  # BFCL's checker saw every turn
    row = record.to_dict()
    assert_token_invariants(row)
    assert prompt_mismatches(record, smol_template, smol_tokenizer) == []  # each prompt: the template's own rendering
    # the end-of-turn the cut call did not sample is an environment token (mask 0, log-prob 0) right after it
    tokens = row["tokens"]
    cut_call = next(item for item in record.output if item.get("generation_token_ids") == script[1].token_ids)
    end = len(cut_call["prompt_token_ids"]) - len(tokens["prompt_ids"]) + len(script[1].token_ids)
    assert tokens["completion_ids"][end] == smol_template.end_of_turn_id
    assert tokens["completion_mask"][end] == 0 and tokens["completion_logprobs"][end] == 0.0


def test_a_cut_last_answer_finishes_length(smol_template, smol_tokenizer, turn) -> None:
    script = reference_script(ROW, turn)
    script[-1] = cut(smol_tokenizer, "All do")
    [record] = run_rows([ROW], [script], smol_template)
    assert (record.finish_reason, record.turns, record.reward) == ("length", len(script), 1.0)


def test_the_turns_bfcl_checks_are_the_ones_bfcls_runner_records_around_cut_calls(smol_template, smol_tokenizer, turn) -> None:
    from environments.bfcl.bridge import shared_worker

    reference = reference_script(ROW, turn)
    tools = ROW["responses_create_params"]["tools"]
    first_calls, second_calls = (smol_tokenizer.decode(reference[index].token_ids[:-1]) for index in (0, 2))
    assert "<tool_call>" in first_calls and "<tool_call>" in second_calls
    script = [
        turn(first_calls), cut(smol_tokenizer, "The file is now in the te"),  # turn 0: calls, then a cut answer
        cut(smol_tokenizer, second_calls + "\nNow I will"),  # turn 1: cut after its calls, which parse: run, the turn goes on
        turn("Done."),
        cut(smol_tokenizer, '<tool_call>{"name": "grep", "arguments": {"file_na'),  # turn 2: cut inside a call: the turn is over
        *reference[-2:],  # turn 3 as BFCL's reference
    ]
    [record] = run_rows([ROW], [script], smol_template)
    assert record.failure_kind is None, record.failure_reason
    expected = bfcl_runner_result([server_answer(smol_template, generation, tools) for generation in script], 1 + len(ROW["bfcl"]["turns"]))
    assert [type(steps[0]).__name__ for steps in expected] == ["list", "list", "str", "list"]  # turn 1's cut call gives calls, turn 2's text
    runner_steps = [[step for step in steps if isinstance(step, list) and step and all(_json_object(a) for call in step for a in call.values())]
                    for steps in expected]
    assert [len(steps) for steps in expected] == [1 + len(steps) for steps in runner_steps]  # each turn ended on a call without calls
    # per BFCL turn, as many model calls as BFCL's runner makes, and the calls it executes run here
    per_turn = user_turns(record)
    assert [sum("generation_token_ids" in item for item in items) for items in per_turn] == [len(steps) for steps in expected]
    assert [sum(item["type"] == "function_call_output" for item in items) for items in per_turn] == [
        sum(len(step) for step in steps) for steps in runner_steps]
    # the steps gym_bridge gives BFCL's checker that decode to calls are those of BFCL's runner's record
    given = [[[{call["name"]: call["arguments"]} for call in step] for step in steps] for steps in turns_of(record.output)]
    assert [[step for step in steps if all(_json_object(a) for call in step for a in call.values())] for steps in given] == runner_steps
    verdict = shared_worker().request("runner_verdict", id=ROW["bfcl"]["id"], result=expected)
    assert (record.reward, record.verify_metrics["bfcl_error_type"]) == (1.0 if verdict["valid"] else 0.0, verdict["error_type"])
    assert record.verify_metrics["bfcl_error_type"] != "multi_turn:force_terminated"
    assert_token_invariants(record.to_dict())
    assert prompt_mismatches(record, smol_template, smol_tokenizer) == []
