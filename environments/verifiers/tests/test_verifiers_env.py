"""verifiers v1 through the capture endpoint: a scripted right and wrong answer scored by the v1 taskset's own reward."""

from __future__ import annotations

import asyncio

import pytest

from environments.verifiers import VerifiersEnvironment, venv_python
from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.policy import SamplingParams, ScriptedPolicy
from gym_bridge.core.task import load_tasks

TASKS = load_tasks(VerifiersEnvironment.example_data)  # type: ignore[arg-type]
needs_venv = pytest.mark.skipif(not venv_python().exists(), reason="no .venv-verifiers: run `make verifiers-venv`")


def rollout(template, policy, task):
    engine = Engine(policy, template, EngineConfig(sampling=SamplingParams(max_new_tokens=64), limits=Limits(), template_check="off"))
    return asyncio.run(engine.rollout(task, env_class=VerifiersEnvironment)).to_dict()


@needs_venv
def test_right_and_wrong_answers_score_as_the_taskset_says(smol_template, turn) -> None:
    policy = ScriptedPolicy({"": [turn("12 + 30 = 42")]})
    record = rollout(smol_template, policy, TASKS[0])
    print(record["metrics"], record["failure_reason"])
    assert record["failure_kind"] is None, record["failure_reason"]
    assert record["reward"] == 1.0
