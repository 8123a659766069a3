"""The BFCL environments: wrong and malformed answers are scored (0 by BFCL's checkers), never crashes; bad input and
a missing, hung or garbled worker are clear errors that fail only their own rollout."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from environments.bfcl import BfclEnvironment, BfclMultiTurnEnvironment, turns_of
from environments.bfcl.bridge import INSTALL_HINT, Worker, WorkerError, require_worker_python
from environments.bfcl.reference import multi_turn_calls, single_turn_calls, tool_call_text
from environments.bfcl.tests.conformance import NO_CALL, needs_bfcl, reference_script, run_rows, runner_disagreements
from gym_bridge.core.errors import ConfigError, MissingExtraError
from gym_bridge.core.items import function_call_item, message_item
from gym_bridge.core.task import parse_task


def rows_of(path: Path) -> dict[str, dict]:
    return {row["bfcl"]["id"]: row for row in map(json.loads, path.read_text().splitlines())}


SINGLE = rows_of(BfclEnvironment.example_data)
MULTI = rows_of(BfclMultiTurnEnvironment.example_data)


def test_a_multi_turn_trajectory_reads_as_bfcls_turns_and_steps() -> None:
    call = lambda name, i: function_call_item(name, "{}", call_id=f"c{i}", item_id=f"f{i}")  # noqa: E731
    output_item = {"type": "function_call_output", "call_id": "c0", "output": "ok"}
    output = [call("ls", 0), call("pwd", 1), output_item, call("cd", 2), output_item, message_item("done", item_id="m0"),
              {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "next"}]},
              message_item("nothing to do", item_id="m1"),
              {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "last"}]}, call("mv", 3)]
    # turn 0: two steps ([ls, pwd], [cd]); turn 1: no call; turn 2: one step ([mv])
    assert [[[c["name"] for c in step] for step in turn] for turn in turns_of(output)] == [[["ls", "pwd"], ["cd"]], [], [["mv"]]]


def test_reference_calls_come_from_the_ground_truth_without_evaluating_it() -> None:
    row = SINGLE["simple_python_0"]
    assert single_turn_calls(row["ground_truth"], row["responses_create_params"]["tools"]) == [
        {"name": "calculate_triangle_area", "arguments": json.dumps({"base": 10, "height": 5})}]
    tools = [{"name": "mv", "parameters": {"properties": {"source": {}, "destination": {}}}}]
    assert multi_turn_calls([["mv('a', destination='b')"]], tools) == [[{"name": "mv", "arguments": json.dumps({"source": "a", "destination": "b"})}]]
    with pytest.raises(ValueError, match="known tool"):
        multi_turn_calls([["__import__('os').system('true')"]], tools)
    with pytest.raises(ValueError):
        multi_turn_calls([["mv(source=open('x'))"]], tools)


def test_a_missing_bfcl_virtualenv_is_the_install_command(monkeypatch) -> None:
    monkeypatch.setenv("GYM_BRIDGE_BFCL_PYTHON", "/nonexistent/python")
    with pytest.raises(MissingExtraError, match="make install-bfcl"):
        require_worker_python()
    with pytest.raises(MissingExtraError, match="make install-bfcl"):
        BfclMultiTurnEnvironment.check_ready()
    assert "make install-bfcl" in INSTALL_HINT


def test_a_worker_that_hangs_or_answers_garbage_is_a_worker_error(tmp_path) -> None:
    hangs = tmp_path / "hangs.py"
    hangs.write_text("import time\ntime.sleep(60)\n")
    garbage = tmp_path / "garbage.py"
    garbage.write_text("import sys\nfor line in sys.stdin:\n    print('not json', flush=True)\n")
    for script, message in ((hangs, "no answer within 0.5 s"), (garbage, "not JSON")):
        worker = Worker(Path(sys.executable))
        worker._fresh = False
        worker._process = __import__("subprocess").Popen([sys.executable, str(script)], stdin=-1, stdout=-1, text=True)
        with pytest.raises(WorkerError, match=message):
            worker.request("hello", timeout_s=0.5)
        assert worker._process is None  # stopped: the next request starts a new worker


@needs_bfcl
def test_an_unknown_category_is_an_error_listing_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="unknown BFCL category 'simple'.*simple_python, simple_java"):
        BfclEnvironment.prepare_rows(split="train", size=1, seed=0, task="simple")
    rows = BfclEnvironment.prepare_rows(split="train", size=3, seed=0, task="multi_turn_miss_func")
    assert [row["agent_ref"]["name"] for row in rows] == ["bfcl_multi_turn"] * 3
    assert rows[0]["bfcl"] == {**MULTI["multi_turn_miss_func_0"]["bfcl"]} and rows[0]["category"] == "multi_turn_miss_func"


@needs_bfcl
def test_wrong_malformed_and_missing_answers_score_zero_by_bfcls_checkers(smol_template, turn) -> None:
    simple, irrelevant, multi = SINGLE["simple_python_0"], SINGLE["irrelevance_0"], MULTI["multi_turn_base_0"]
    wrong_value = tool_call_text([{"name": "calculate_triangle_area", "arguments": json.dumps({"base": 11, "height": 5})}])
    malformed = '<tool_call>{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": }}</tool_call>'
    some_call = tool_call_text([{"name": irrelevant["responses_create_params"]["tools"][0]["name"], "arguments": "{}"}])
    reference = reference_script(multi, turn)
    skipped_turn = [turn(NO_CALL), *reference[2:]]  # turn 0 answered without its calls, the rest right
    unknown_tool = [turn(tool_call_text([{"name": "format_disk", "arguments": "{}"}])), *reference[1:]]
    bad_row = {**simple, "bfcl": {"category": "simple_python"}}
    rows = [simple, simple, simple, irrelevant, multi, multi, bad_row, simple]
    scripts = [[turn(wrong_value)], [turn(malformed)], [turn(NO_CALL)], [turn(some_call)], skipped_turn, unknown_tool,
               [turn(NO_CALL)], reference_script(simple, turn)]
    records = run_rows(rows, scripts, smol_template)
    errors = [(record.reward, record.failure_kind, record.verify_metrics.get("bfcl_error_type")) for record in records]
    assert errors[:4] == [(0.0, None, "value_error:others"), (0.0, None, "ast_decoder:decoder_failed"),
                          (0.0, None, "ast_decoder:decoder_failed"), (0.0, None, "irrelevance_error:decoder_success")]
    assert errors[4] == (0.0, None, "multi_turn:empty_turn_model_response")
    assert errors[5][:2] == (0.0, None)  # the unknown tool is an error the model reads; its turn misses the state
    assert json.loads(next(item["output"] for item in records[5].output if item["type"] == "function_call_output"))["error"].startswith("unknown tool 'format_disk'")
    assert errors[6][:2] == (0.0, "env") and "bfcl: {id, category}" in records[6].failure_reason  # only that rollout fails
    assert errors[7] == (1.0, None, "")
    # BFCL's own eval runner, fed the same answers, agrees on every scored rollout
    assert runner_disagreements([row for row, record in zip(rows, records) if record.failure_kind is None],
                                [record for record in records if record.failure_kind is None]) == {}


@needs_bfcl
def test_miss_func_offers_the_held_out_function_at_its_turn_with_bfcls_message(smol_template, turn) -> None:
    row = MULTI["multi_turn_miss_func_0"]  # `sort` is held out until turn 3, whose user message BFCL leaves empty
    [record] = run_rows([row], [reference_script(row, turn)], smol_template)
    assert record.reward == 1.0
    users = [item for item in record.output if item["type"] == "message" and item.get("role") == "user"]
    assert len(users) == len(row["bfcl"]["turns"])
    texts = [part["text"] for part in users[2]["content"]]
    assert '"name": "sort"' in texts[0] and texts[0].endswith("I have updated some more functions you can choose from. What about now?")
    early = run_rows([row], [[turn(tool_call_text([{"name": "sort", "arguments": json.dumps({"file_name": "final_report.pdf"})}])), turn("Done.")]],
                     smol_template)[0]
    assert "unknown tool 'sort'" in next(item["output"] for item in early.output if item["type"] == "function_call_output")
    verify = BfclMultiTurnEnvironment().verify(parse_task(row, index=0), [message_item("no calls", item_id="m")])
    assert verify.metrics["bfcl_error_type"] == "multi_turn:force_terminated"  # one turn answered of five
