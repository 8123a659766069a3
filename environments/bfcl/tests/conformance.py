"""Shared by the BFCL tests: rows straight from the installed bfcl-eval, and BFCL's reference answers replayed
through the real engine with a scripted policy (the embedded model's tokenizer and chat template)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from environments.bfcl import BfclEnvironment, BfclMultiTurnEnvironment, calls_of, is_multi_turn, prepare_bfcl_rows, turns_of
from environments.bfcl.bridge import shared_worker, worker_python
from environments.bfcl.reference import multi_turn_calls, single_turn_calls, tool_call_text
from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.policy import ScriptedPolicy
from gym_bridge.core.record import RolloutRecord
from gym_bridge.core.registry import register
from gym_bridge.core.task import parse_task

needs_bfcl = pytest.mark.skipif(worker_python() is None, reason="BFCL's virtualenv is missing: run `make install-bfcl`")
NO_CALL = "None of the functions can answer this."


def categories() -> list[str]:
    return list(shared_worker().request("hello")["categories"])


def reference_script(row: dict[str, Any], turn) -> list[Any]:
    """The scripted model turns that give BFCL's reference answer for `row`."""
    category = row["bfcl"]["category"]
    if "irrelevance" in category:
        return [turn(NO_CALL)]
    if category == "live_relevance":  # BFCL has no ground truth here: any decodable call is right
        return [turn(tool_call_text([{"name": row["responses_create_params"]["tools"][0]["name"], "arguments": "{}"}]))]
    if not is_multi_turn(category):
        source = category in ("simple_java", "simple_javascript")
        return [turn(tool_call_text(single_turn_calls(row["ground_truth"], row["responses_create_params"]["tools"], source=source)))]
    opened = shared_worker().request("open", session="reference", id=row["bfcl"]["id"])
    shared_worker().request("close", session="reference")
    tools = [*row["responses_create_params"]["tools"], *(tool for added in opened["added"].values() for tool in added["tools"])]
    script = []
    for calls in multi_turn_calls(row["ground_truth"], tools):
        script += [turn(tool_call_text(calls)), turn("Done.")] if calls else [turn(NO_CALL)]
    return script


def run_rows(rows: list[dict[str, Any]], scripts: list[list[Any]], template, *, max_concurrency: int = 8) -> list[RolloutRecord]:
    """Rollouts of `rows` through the engine, row i answered by `scripts[i]`; records in row order."""
    register(BfclEnvironment)
    register(BfclMultiTurnEnvironment)
    tasks = [parse_task(row, index=index) for index, row in enumerate(rows)]
    policy = ScriptedPolicy({f"{index}-0": script for index, script in enumerate(scripts)})
    limits = Limits(max_turns=200, max_completion_tokens=2_000_000, max_tool_output_chars=1_000_000)
    engine = Engine(policy, template, EngineConfig(limits=limits, max_concurrency=max_concurrency, deadline_s=1800.0))

    async def collect() -> list[RolloutRecord]:
        return [record async for record in engine.stream(tasks)]

    records = asyncio.run(collect())
    return sorted(records, key=lambda record: record.task.index)


def category_rows(category: str, size: int) -> list[dict[str, Any]]:
    return prepare_bfcl_rows(size=size, task=category)


def bfcl_result(row: dict[str, Any], record: RolloutRecord) -> Any:
    """A rollout's answer in BFCL's own result format for a function-calling model: single-turn, the calls as
    `[{name: arguments}]` (the answer's text when there are none); multi-turn, per turn, per step, those calls."""
    if is_multi_turn(row["bfcl"]["category"]):
        return [[[{call["name"]: call["arguments"]} for call in step] for step in turn] for turn in turns_of(record.output)]
    calls = calls_of(record.output)
    if calls:
        return [{call["name"]: call["arguments"]} for call in calls]
    return next((part.get("text", "") for item in record.output if item["type"] == "message" for part in item.get("content", [])), "")


def runner_disagreements(rows: list[dict[str, Any]], records: list[RolloutRecord]) -> dict[str, tuple[float, dict[str, Any]]]:
    """The rollouts whose reward differs from BFCL's eval runner's verdict on the same answer: id -> (reward, verdict)."""
    disagree = {}
    for row, record in zip(rows, records):
        verdict = shared_worker().request("runner_verdict", id=row["bfcl"]["id"], result=bfcl_result(row, record))
        if record.reward != (1.0 if verdict["valid"] else 0.0):
            disagree[row["bfcl"]["id"]] = (record.reward, verdict)
    return disagree
