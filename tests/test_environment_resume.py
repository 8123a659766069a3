"""Each bundled environment's resume kind: a rollout killed before its last model call and resumed from the journal
scores and reads exactly as the uninterrupted one (its committed turns are not generated again)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.environment import Environment
from gym_bridge.core.registry import get_environment, known_environments
from gym_bridge.core.task import load_tasks
from tests.support.invariants import assert_token_invariants
from tests.support.resume_kit import TurnPolicy, comparable, kill_then_resume, run

KINDS = {
    "weather": "replay", "multi_step": "replay", "workplace_assistant": "snapshot", "user_sim": "replay",
    "arithmetic": "replay", "math": "replay", "mcqa": "replay", "instruction_following": "replay", "reasoning_gym": "replay",
    "llm_judge": "replay", "code": "replay", "nemo_gym_remote": "replay", "harness_example": "restart",
}


def call(name: str, **arguments) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


SCRIPTS = {
    "weather": [call("get_weather", city="Seattle"), "It is cold in Seattle."],
    "multi_step": [call("get_synonym_value", synonym="Warm"), call("get_synonym_value", synonym="Blazing"),
                   call("extract_synonym_values", synonym_values=[407, 711]), "Submitted."],
    # the forward changes the database; the search after it reads the restored one
    "workplace_assistant": [call("email_forward_email", email_id="00000038", recipient="nikhil.rao@orbitech.com"),
                            call("email_search_emails", query="quarterly report"), "Forwarded."],
    # asks for every detail (the scripted user answers all three), then submits them
    "user_sim": ["May I have your name, your check-in date and how many nights you stay?",
                 call("submit_request", fields={"guest_name": "Margaret Berners-Lee", "check_in": "2025-02-21", "nights": "1"})],
}


KILL_AT = {"workplace_assistant": 2}
"""The call that dies (default: the last): workplace's search then runs live on the restored database."""


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_bundled_environment_declares_its_resume_kind(name):
    assert name in known_environments()
    assert get_environment(name).resume == KINDS[name]


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_resumed_episode_scores_as_the_uninterrupted_one(name, tmp_path, smol_template, smol_tokenizer):
    env_class: type[Environment] = get_environment(name)
    rows = load_tasks(env_class.example_data)[:1]
    script = [_turn(smol_tokenizer, text) for text in SCRIPTS[name]]
    baseline = run(Engine(TurnPolicy(smol_template, script), smol_template, EngineConfig()), rows)[0]
    assert baseline["reward"] == 1.0, baseline["failure_reason"] or baseline["metrics"]
    kill_at = KILL_AT.get(name, len(script))
    records, policy, _ = kill_then_resume(tmp_path / "journal", smol_template, script, rows, kill_at=kill_at)
    record = records[0]
    assert comparable(record) == comparable(baseline)  # same reward, same tokens, same tool outputs
    assert_token_invariants(record)
    assert record["metrics"]["resumed_from_turn"] == kill_at - 1 and record["metrics"]["attempts"] == 2
    assert policy.calls == len(script) - (kill_at - 1)  # the committed turns came from the journal


def test_a_remote_environment_replays_into_a_fresh_server_session(tmp_path, smol_template, smol_tokenizer):
    from environments.nemo_gym_remote import NemoGymRemoteEnvironment
    from environments.nemo_gym_remote.example_server import ServerState, build_app
    from tests.support.http_server import app_in_thread

    state = ServerState()
    with app_in_thread(build_app(state)) as url:
        env_class = NemoGymRemoteEnvironment.bind("weather_remote_for_resume_test", url)
        rows = [replace(task, env_name=env_class.name) for task in load_tasks(get_environment("weather").example_data)[:1]]
        script = [_turn(smol_tokenizer, text) for text in SCRIPTS["weather"]]
        baseline = run(Engine(TurnPolicy(smol_template, script), smol_template, EngineConfig()), rows)[0]
        records, policy, _ = kill_then_resume(tmp_path / "journal", smol_template, script, rows, kill_at=2)
    assert baseline["reward"] == 1.0 and comparable(records[0]) == comparable(baseline)
    assert policy.calls == 1


def _turn(tokenizer, text: str):
    from gym_bridge.core.policy import Generation

    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    return Generation(token_ids=ids, logprobs=[-0.25] * len(ids), finish_reason="stop")
