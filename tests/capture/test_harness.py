"""The harness kind end to end over loopback: a real `openai` agent (command and callable) against
the capture endpoint, served by the scripted policy, so every token id is known."""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import replace
from pathlib import Path

import openai
import pytest

from environments.harness_example import HarnessExampleEnvironment
from gym_bridge.capture import HarnessEnvironment
from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.policy import ScriptedPolicy, SamplingParams
from gym_bridge.core.errors import BackendError, ContextOverflowError
from gym_bridge.core.task import load_tasks, parse_task

EXAMPLE = Path(__file__).parents[2] / "environments" / "harness_example" / "data" / "example.jsonl"
ADD_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 30}}\n</tool_call>'


def engine(template, script, **limits) -> tuple[Engine, ScriptedPolicy]:  # type: ignore[no-untyped-def]
    policy = ScriptedPolicy(script)
    config = EngineConfig(sampling=SamplingParams(max_new_tokens=64), limits=Limits(**limits), deadline_s=60, template_check="off")
    return Engine(policy, template, config), policy


def rollout(engine_: Engine, env_class, row_index: int = 0):  # type: ignore[no-untyped-def]
    task = load_tasks(EXAMPLE)[row_index]
    return asyncio.run(engine_.rollout(task, env_class=env_class)).to_dict()


def test_the_example_agent_runs_its_tool_loop_and_every_token_is_captured(smol_template, turn) -> None:
    first, second = turn(ADD_CALL), turn("12 + 30 = 42")
    eng, policy = engine(smol_template, {"": [first, second]})
    record = rollout(eng, HarnessExampleEnvironment)
    assert record["failure_kind"] is None, record["failure_reason"]
    assert record["reward"] == 1.0 and record["metrics"]["finish_reason"] == "answer"
    calls = policy.calls
    assert len(calls) == 2
    # call 2's prompt = call 1's prompt + its sampled ids + the rendered tool output: token-in, no re-tokenizing
    head = list(calls[0].prompt_ids) + first.token_ids
    assert list(calls[1].prompt_ids[: len(head)]) == head
    tokens = record["tokens"]
    assert tokens["prompt_ids"] == list(calls[0].prompt_ids) and "segments" not in tokens
    env_ids = list(calls[1].prompt_ids[len(head):])
    assert tokens["completion_ids"] == first.token_ids + env_ids + second.token_ids
    assert tokens["completion_mask"] == [1] * len(first.token_ids) + [0] * len(env_ids) + [1] * len(second.token_ids)
    assert tokens["completion_logprobs"] == first.logprobs + [0.0] * len(env_ids) + second.logprobs
    assert '{"result": 42}' in smol_template.tokenizer.decode(env_ids)  # the agent ran its own tool
    verify = record["metrics"]["verify"]
    assert verify["segments"] == 1 and verify["rewrites"] == 0 and verify["token_in_calls"] == 1
    assert verify["harness_exit_code"] == 0 and verify["stdout_tail"].strip() == "12 + 30 = 42"
    kinds = [item["type"] for item in record["response"]["output"]]
    assert kinds == ["function_call", "function_call_output", "message"]


async def rewriting_agent(client: openai.AsyncOpenAI, task: dict) -> str:
    """Calls twice; the second call drops the first answer and edits the question (a compaction)."""
    messages = list(task["messages"])
    reply = await client.chat.completions.create(model=task["model"], messages=messages)
    edited = [messages[0], {"role": "user", "content": "Summary so far: " + (reply.choices[0].message.content or "")}]
    again = await client.chat.completions.create(model=task["model"], messages=edited)
    return again.choices[0].message.content or ""


class Rewriting(HarnessEnvironment):
    name = "rewriting_harness"
    agent = rewriting_agent

    def score(self, task, answer):  # type: ignore[no-untyped-def]
        return float(answer == "42")


def test_a_rewritten_history_starts_a_new_segment_and_both_are_kept(smol_template, turn) -> None:
    first, second = turn("thinking about it"), turn("42")
    eng, policy = engine(smol_template, {"": [first, second]})
    record = rollout(eng, Rewriting)
    assert record["failure_kind"] is None, record["failure_reason"]
    assert record["reward"] == 1.0
    segments = record["tokens"]["segments"]
    assert len(segments) == 2 and record["metrics"]["verify"]["rewrites"] == 1
    assert segments[0]["completion_ids"] == first.token_ids
    assert segments[1]["prompt_ids"] == list(policy.calls[1].prompt_ids) == record["tokens"]["prompt_ids"]
    assert record["tokens"]["completion_ids"] == second.token_ids


def command_env(source: str, **attributes: object) -> type[HarnessEnvironment]:
    class Command(HarnessEnvironment):
        name = "command_harness"
        command = (sys.executable, "-c", source)
        harness_timeout_s = attributes.get("timeout_s", 30.0)  # type: ignore[assignment]

        def score(self, task, answer):  # type: ignore[no-untyped-def]
            return 1.0

    return Command


CALL_ONCE = ("import json, os, sys, openai; task = json.load(sys.stdin); c = openai.OpenAI(max_retries=0); "
             "r = c.chat.completions.create(model=os.environ['OPENAI_MODEL'], messages=task['messages']); print(r.choices[0].message.content)")


def test_a_command_that_cannot_start_is_an_env_failure_and_a_task_file_is_given(smol_template, turn) -> None:
    eng, _ = engine(smol_template, {"": []})
    record = rollout(eng, type("Missing", (command_env(""),), {"command": ("/nonexistent/agent",)}))
    assert record["failure_kind"] == "env" and "cannot start the harness ['/nonexistent/agent']" in record["failure_reason"]
    from_file = CALL_ONCE.replace("json.load(sys.stdin)", "json.load(open(os.environ['GYM_BRIDGE_TASK_FILE']))")
    eng, _ = engine(smol_template, {"": [turn("42")]})
    record = rollout(eng, command_env(from_file))
    assert record["failure_kind"] is None and record["metrics"]["verify"]["stdout_tail"].strip() == "42"


@pytest.mark.parametrize(("source", "kind", "says"), [
    ("import sys; print('partial work'); sys.stderr.write('boom\\n'); sys.exit(3)", "env", "exited with status 3"),
    ("print('I answer without a model')", "env", "without calling the model"),
    ("import time; time.sleep(60)", "timeout", "did not finish within 1 s"),
])
def test_a_command_that_crashes_hangs_or_calls_no_model_is_a_typed_failure(smol_template, source, kind, says) -> None:
    eng, _ = engine(smol_template, {"": []})
    record = rollout(eng, command_env(source, timeout_s=1.0))
    assert record["failure_kind"] == kind and says in record["failure_reason"]
    assert record["mask_sample"] is True
    if "boom" in source:
        assert "boom" in record["failure_reason"] and "partial work" in record["failure_reason"]


@pytest.mark.parametrize("by", ["harness_timeout", "engine_deadline"])
def test_a_hanging_command_is_killed_with_its_children(smol_template, tmp_path, by) -> None:
    pid_file = tmp_path / "child.pid"
    source = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    # room for two interpreters to start on a loaded machine; the engine's deadline cancels the loop
    eng, _ = engine(smol_template, {"": []})
    if by == "engine_deadline":
        eng.config = replace(eng.config, deadline_s=6.0)
    record = rollout(eng, command_env(source, timeout_s=6.0 if by == "harness_timeout" else 50.0))
    assert record["failure_kind"] == "timeout"
    assert pid_file.exists(), "the command was killed before it started its child; raise the limits"
    child = int(pid_file.read_text())
    status = Path(f"/proc/{child}/stat")
    assert not status.exists() or status.read_text().split()[2] == "Z"  # gone (or a zombie awaiting its reaper)


def test_n_2_gets_a_400_and_the_rollout_records_it(smol_template) -> None:
    source = CALL_ONCE.replace("messages=task['messages'])", "messages=task['messages'], n=2)")
    eng, policy = engine(smol_template, {"": []})
    record = rollout(eng, command_env(source))
    assert record["failure_kind"] == "env"
    assert "the endpoint answered 400: n=2 is not supported" in record["failure_reason"]
    assert "BadRequestError" in record["failure_reason"] and policy.calls == []


def test_a_streaming_command_reads_the_answer_and_its_call_is_captured(smol_template, turn) -> None:
    source = ("import json, os, sys, openai; task = json.load(sys.stdin); c = openai.OpenAI(max_retries=0); "
              "s = c.chat.completions.create(model=os.environ['OPENAI_MODEL'], messages=task['messages'], stream=True); "
              "print(''.join(k.choices[0].delta.content or '' for k in s if k.choices))")
    answer = turn("12 + 30 = 42")
    eng, policy = engine(smol_template, {"": [answer]})
    record = rollout(eng, command_env(source))
    assert record["failure_kind"] is None, record["failure_reason"]
    assert record["metrics"]["verify"]["stdout_tail"].strip() == "12 + 30 = 42" and record["metrics"]["verify"]["endpoint_errors"] == []
    assert record["tokens"]["prompt_ids"] == list(policy.calls[0].prompt_ids) and record["tokens"]["completion_ids"] == answer.token_ids


def test_an_unknown_model_is_a_404_like_openai(smol_template) -> None:
    source = CALL_ONCE.replace("model=os.environ['OPENAI_MODEL']", "model='gpt-unknown'")
    eng, _ = engine(smol_template, {"": []})
    record = rollout(eng, command_env(source))
    assert "404: The model `gpt-unknown` does not exist" in record["failure_reason"]
    assert "NotFoundError" in record["failure_reason"]


def test_calling_past_the_turn_budget_ends_the_rollout_as_max_turns(smol_template, turn) -> None:
    loop_forever = CALL_ONCE.replace("r = c.chat", "\nwhile True: r = c.chat").replace("; print(r.choices[0].message.content)", "")
    eng, policy = engine(smol_template, {"": [turn("a"), turn("b"), turn("c")]}, max_turns=2)
    record = rollout(eng, command_env(loop_forever))
    assert record["failure_kind"] is None and record["metrics"]["finish_reason"] == "max_turns"
    assert len(policy.calls) == 2
    assert any("limit of 2 model calls" in error for error in record["metrics"]["verify"]["endpoint_errors"])


@pytest.mark.parametrize(("error", "kind", "says"), [
    (ContextOverflowError("prompt of 9000 tokens, context 8192"), "context_overflow", "9000 tokens"),
    (BackendError("connection refused"), "infra", "generation backend: connection refused"),
])
def test_a_context_overflow_or_a_backend_error_is_its_failure_kind(smol_template, error, kind, says) -> None:
    eng, _ = engine(smol_template, {"": [error]})
    record = rollout(eng, command_env(CALL_ONCE))
    assert record["failure_kind"] == kind and says in record["failure_reason"]


def test_rows_can_name_their_own_command_where_the_environment_allows_it(smol_template, turn) -> None:
    row = json.loads(EXAMPLE.read_text().splitlines()[0])
    row["harness"] = {"command": [sys.executable, "-c", CALL_ONCE]}
    eng, _ = engine(smol_template, {"": [turn("42")]})
    allowing = type("Allowing", (HarnessExampleEnvironment,), {"allow_row_commands": True})  # refused by default: test_harness_hardening.py
    record = asyncio.run(eng.rollout(parse_task(row, index=0), env_class=allowing)).to_dict()
    assert record["failure_kind"] is None and record["reward"] == 1.0
    assert record["metrics"]["verify"]["stdout_tail"].strip() == "42"


def test_a_last_answer_cut_at_its_token_limit_finishes_as_length(smol_template, turn) -> None:
    eng, _ = engine(smol_template, {"": [turn("42 is the", eos=False, finish_reason="length")]})
    record = rollout(eng, command_env(CALL_ONCE))
    assert record["failure_kind"] is None and record["metrics"]["finish_reason"] == "length"


async def crashing_agent(client: openai.AsyncOpenAI, task: dict) -> str:
    await client.chat.completions.create(model=task["model"], messages=list(task["messages"]))
    raise RuntimeError("agent bug 7")


class Crashing(HarnessEnvironment):
    name = "crashing_harness"
    agent = crashing_agent

    def score(self, task, answer):  # type: ignore[no-untyped-def]
        return 1.0


def test_a_callable_that_raises_is_an_env_failure_with_its_traceback_and_keeps_its_tokens(smol_template, turn) -> None:
    answer = turn("hello")
    eng, _ = engine(smol_template, {"": [answer]})
    record = rollout(eng, Crashing)
    assert record["failure_kind"] == "env" and "RuntimeError: agent bug 7" in record["failure_reason"]
    assert record["tokens"]["completion_ids"] == answer.token_ids  # what was captured before the crash is kept
