"""`/run` checks a row's verifier fields as `gym-bridge data validate` does (the environment's `validate_row`).

Over real HTTP on loopback; the model server is unreachable, so a row that passes the checks runs and comes
back masked (`infra`), while a row that fails them gets a 422 before any rollout starts.
"""

from __future__ import annotations

import json

import httpx
import pytest

from gym_bridge.core.registry import get_environment
from gym_bridge.data.task_files import check_row
from gym_bridge.serve.agent_server import AgentServerSettings, build_app
from tests.support.http_server import app_in_thread


@pytest.fixture(scope="module")
def mcqa_row() -> dict:
    with open(get_environment("mcqa").example_data, encoding="utf-8") as handle:
        return json.loads(handle.readline())


@pytest.fixture(scope="module")
def agent_url():
    settings = AgentServerSettings(envs=("mcqa", "arithmetic"), model_base_urls=("http://127.0.0.1:9/v1",), model="m",
                                   max_retries=0, request_timeout_s=5)
    with app_in_thread(build_app(settings)) as url:
        yield url


@pytest.mark.parametrize("change, field", [
    ({"expected_answer": "E"}, "expected_answer"),                 # not one of the option letters A-D
    ({"options": "A, B, C"}, "options"),                           # not a list
    ({"grading_mode": "loose"}, "grading_mode"),                   # not one of the grading modes
    ({"template_metadata": {"output_regex": "("}}, "template_metadata.output_regex[0]"),
])
def test_a_row_with_bad_verifier_fields_gets_422_naming_the_field(agent_url, mcqa_row, change, field):
    row = {**mcqa_row, **change}
    _, problems = check_row(row, source="row")                     # what `gym-bridge data validate` reports
    assert problems and problems[0].field == field
    completed = httpx.get(agent_url + "/health").json()["completed"]
    answer = httpx.post(agent_url + "/run", json=row, timeout=30)
    assert answer.status_code == 422, answer.text
    assert answer.json()["field"] == field
    assert problems[0].message in answer.json()["detail"] and "'mcqa'" in answer.json()["detail"]
    assert httpx.get(agent_url + "/health").json()["completed"] == completed  # no rollout ran


def test_every_problem_is_listed_and_the_first_is_the_field(agent_url, mcqa_row):
    row = {**mcqa_row, "expected_answer": "E", "template_metadata": {"output_regex": "("}}
    answer = httpx.post(agent_url + "/run", json=row, timeout=30)
    assert answer.status_code == 422 and answer.json()["field"] == "expected_answer"
    assert "template_metadata.output_regex[0]: invalid regex" in answer.json()["detail"]


def test_another_environments_checks_run_too(agent_url):
    row = {"responses_create_params": {"input": "What is 2 + 2?"}, "expected_answer": "four", "agent_ref": {"name": "arithmetic"}}
    answer = httpx.post(agent_url + "/run", json=row, timeout=30)
    assert answer.status_code == 422 and answer.json()["field"] == "expected_answer"
    assert "is not an integer" in answer.json()["detail"]


def test_a_valid_row_still_runs(agent_url, mcqa_row):
    answer = httpx.post(agent_url + "/run", json=mcqa_row, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["failure_kind"] == "gym_bridge:infra"       # it ran: the model server is down
