"""Rollout files made for real by the engine with a scripted policy and bundled environments (multi_step:
three tool calls and an answer; weather: one call, or none at all); fixtures of tests/view and tests/core/test_health.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.health import HealthSettings
from gym_bridge.core.policy import ScriptedPolicy
from gym_bridge.eval.run import EvalResult, run_eval, select_tasks

CALL = '<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


def call(name: str, **arguments: object) -> str:
    return CALL.format(name=name, args=json.dumps(arguments))


def multi_step_script(turn) -> list:
    # task 0 of multi_step's example data asks for Warm then Blazing; values are code-point sums:
    # Warm = 87+97+114+109 = 407, Blazing = 66+108+97+122+105+110+103 = 711
    return [
        turn(call("get_synonym_value", synonym="Warm")),
        turn(call("get_synonym_value", synonym="Blazing")),
        turn(call("extract_synonym_values", synonym_values=[407, 711])),
        turn("The values are 407 and 711."),
    ]


def evaluate(template, script: list, *, env: str, limit: int, output: Path, health: HealthSettings | None = None) -> EvalResult:
    engine = Engine(ScriptedPolicy({"": script}), template, EngineConfig(model_name="SmolLM2-135M-Instruct (embedded)"))
    tasks = select_tasks(env_names=[env], limit=limit)
    result = asyncio.run(run_eval(engine, tasks, output=output, health=health))
    # records are written as rollouts finish, in any order: the tests read them in task order
    lines = output.read_text().splitlines(keepends=True)
    output.write_text("".join(sorted(lines, key=lambda line: (json.loads(line)["task_index"], json.loads(line)["repeat_index"]))))
    return result


@pytest.fixture(scope="session")
def multi_step_file(tmp_path_factory, smol_template, turn) -> Path:
    """Two multi_step rollouts: task 0 answered right (reward 1), task 1 with the same calls (reward 0)."""
    output = tmp_path_factory.mktemp("rollouts") / "multi_step.jsonl"
    evaluate(smol_template, multi_step_script(turn), env="multi_step", limit=2, output=output)
    return output


@pytest.fixture(scope="session")
def mixed_file(tmp_path_factory, smol_template, turn, multi_step_file) -> Path:
    """multi_step's two rollouts plus three weather rollouts that answer without calling get_weather (reward 0)."""
    folder = tmp_path_factory.mktemp("mixed")
    weather = folder / "weather.jsonl"
    evaluate(smol_template, [turn("It is probably sunny.")], env="weather", limit=3, output=weather)
    mixed = folder / "mixed.jsonl"
    mixed.write_text(multi_step_file.read_text() + weather.read_text())
    return mixed
