"""A harness gets only the row fields its environment allows (`harness_row_fields`): by default its input, tools
and routing, never the verifier's fields (`expected_answer`), which an agent the model drives (a shell tool) could
read and copy into its answer: a reward hack in RL. The verifier still scores against the whole row."""

from __future__ import annotations

import asyncio
import json

import pytest

from gym_bridge.capture import HarnessEnvironment
from gym_bridge.core.errors import UserError
from gym_bridge.core.task import parse_task
from tests.capture.test_harness_hardening import engine, example_row, rollout, shell_env

ANSWER = example_row()["expected_answer"]
"""The first example row's answer ("42"), which the scripted model gives."""
SHOW_TASK = 'cat "$GYM_BRIDGE_TASK_FILE"; echo; cat; echo; exec "$0" -c "$1"'
"""Print the task file, then stdin, then run the one-call agent."""


def seen_by_harness(smol_template, turn, **attributes: object) -> tuple[dict, dict]:  # type: ignore[no-untyped-def]
    """The task the harness read from its file and from stdin (the same text), and the record."""
    env_class = shell_env(SHOW_TASK, **attributes)
    env_class.score = lambda self, task, answer: float(answer.strip() == task.row["expected_answer"])  # type: ignore[method-assign]
    record = rollout(engine(smol_template, {"": [turn(ANSWER)]}), env_class)
    from_file, from_stdin = record["metrics"]["verify"]["stdout_tail"].splitlines()[:2]
    assert from_file == from_stdin
    return json.loads(from_file), record


def test_the_verifier_fields_do_not_reach_the_harness_by_default(smol_template, turn) -> None:
    task, record = seen_by_harness(smol_template, turn)
    assert "expected_answer" not in task["row"] and f'"{ANSWER}"' not in json.dumps(task)
    assert sorted(task["row"]) == ["agent_ref", "responses_create_params"]
    assert task["row"]["responses_create_params"] == example_row()["responses_create_params"]
    assert record["failure_kind"] is None and record["reward"] == 1.0  # the verifier scored against the whole row
    assert record["expected_answer"] == ANSWER  # and the record keeps it


def test_an_environment_can_allow_more_fields_or_the_whole_row(smol_template, turn) -> None:
    task, _ = seen_by_harness(smol_template, turn, harness_row_fields=("responses_create_params", "expected_answer"))
    assert sorted(task["row"]) == ["expected_answer", "responses_create_params"]
    task, _ = seen_by_harness(smol_template, turn, harness_row_fields=None)
    assert task["row"] == example_row()


def test_a_callable_agent_gets_the_same_fields(smol_template, turn) -> None:
    seen: list[dict] = []

    async def agent(client, task):  # type: ignore[no-untyped-def]
        seen.append(task)
        answer = await client.chat.completions.create(model="gym-bridge-policy", messages=task["messages"])
        return answer.choices[0].message.content

    class Callable(HarnessEnvironment):
        name = "harness_row_fields_callable"

        def score(self, task, answer):  # type: ignore[no-untyped-def]
            return float(answer == ANSWER)

    Callable.agent = staticmethod(agent)  # type: ignore[assignment]
    record = asyncio.run(engine(smol_template, {"": [turn(ANSWER)]}).rollout(
        parse_task(example_row(), index=0, source="rows.jsonl:1"), env_class=Callable)).to_dict()
    assert record["reward"] == 1.0 and "expected_answer" not in seen[0]["row"]


@pytest.mark.parametrize("value", ["expected_answer", [""], [1], {"a": 1}])
def test_a_malformed_field_list_is_refused_before_a_run(value) -> None:
    with pytest.raises(UserError, match="harness_row_fields must be a list of row field names"):
        shell_env("true", harness_row_fields=value).check_ready()
