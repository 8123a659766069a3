"""The user_sim environment: its own loop with a scripted or policy-driven user, reward and token invariants."""

from __future__ import annotations

import asyncio
import json

from environments.user_sim import UserSimEnvironment, matches
from gym_bridge import Engine, EngineConfig, Generation, TextModel, SamplingParams, ScriptedPolicy
from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.items import item_text
from gym_bridge.core.task import load_tasks, parse_task
from tests.support.invariants import assert_token_invariants

HOTEL = next(task.row for task in load_tasks(UserSimEnvironment.example_data) if task.row["scenario"] == "hotel")
FIELDS = HOTEL["expected_request"]                      # guest_name, check_in, nights


def submit(fields: dict) -> str:
    return f'<tool_call>\n{json.dumps({"name": "submit_request", "arguments": {"fields": fields}})}\n</tool_call>'


def run(script: list, env_class: type[UserSimEnvironment], smol_template, *, max_turns: int = 6):
    policy = ScriptedPolicy({"0-0": script})
    config = EngineConfig(sampling=SamplingParams(max_new_tokens=128), limits=Limits(max_turns=max_turns, max_completion_tokens=4096))
    engine = Engine(policy, smol_template, config)
    task = parse_task(HOTEL, index=0)
    record = asyncio.run(engine.rollout(task, env_class=env_class))
    assert record.failure_kind is None, record.failure_reason
    assert_token_invariants(record.to_dict())
    return record


def user_lines(record) -> list[str]:
    return [item_text(item) for item in record.output if item["type"] == "message" and item["role"] == "user"]


def test_asking_for_every_detail_then_submitting_them_meets_the_goal(smol_template, turn) -> None:
    script = [
        turn("Welcome! May I have your name, please?"),
        turn("Thank you. When will you arrive, and how many nights will you stay?"),
        turn(submit({**FIELDS, "guest_name": FIELDS["guest_name"].upper() + "  "})),   # case and spacing are normalised
    ]
    record = run(script, UserSimEnvironment, smol_template)
    assert record.reward == 1.0 and record.finish_reason == "answer"
    assert record.verify_metrics == {"goal_met": True, "submitted": True, "user_turns": 2, "facts_revealed": 3, "ended_by": "goal"}
    lines = user_lines(record)
    assert FIELDS["guest_name"] in lines[0] and FIELDS["check_in"] in lines[1] and FIELDS["nights"] in lines[1]
    # the user's replies are environment tokens between the model's turns
    assert sum(record.tokens.completion_mask) < len(record.tokens.completion_ids)


def test_a_wrong_submission_does_not_end_the_episode_and_scores_0(smol_template, turn) -> None:
    wrong = {**FIELDS, "nights": str(int(FIELDS["nights"]) + 1)}
    script = [
        turn("Your name, please? And your arrival date and number of nights?"),
        turn(submit(wrong)),
        turn("All booked, thank you!"),
        turn("Anything else?"),
    ]
    record = run(script, UserSimEnvironment, smol_template, max_turns=4)
    assert record.reward == 0.0 and record.finish_reason == "max_turns"
    assert record.verify_metrics["submitted"] and not record.verify_metrics["goal_met"]
    assert record.verify_metrics["ended_by"] == "turns"


def test_the_user_leaves_after_its_turns_run_out(smol_template, turn) -> None:
    env_class = type("PatientUser", (UserSimEnvironment,), {"max_user_turns": 2})
    script = [turn("How can I help?"), turn("How can I help?"), turn("How can I help?")]
    record = run(script, env_class, smol_template)
    assert (record.reward, record.finish_reason, record.verify_metrics["ended_by"]) == (0.0, "answer", "user")
    assert user_lines(record) == [HOTEL["user_sim"]["fallback"]] * 2


def test_a_policy_driven_user_sees_the_conversation_from_its_side(smol_template, smol_tokenizer, turn) -> None:
    user_policy = ScriptedPolicy({"": [Generation([1], [0.0], "stop", text=f"I am {FIELDS['guest_name']}.")]})
    done = ScriptedPolicy({"": [Generation([1], [0.0], "stop", text="[[DONE]]")]})

    class PolicyUser(UserSimEnvironment):
        simulator = "policy"
        user = TextModel(user_policy, smol_template)

    record = run([turn("Who am I speaking with?"), turn(submit(FIELDS))], PolicyUser, smol_template)
    assert record.reward == 1.0 and user_lines(record) == [f"I am {FIELDS['guest_name']}."]
    seen = smol_tokenizer.decode(user_policy.calls[0].prompt_ids)
    assert "role-playing a USER" in seen and HOTEL["user_sim"]["persona"] in seen
    # the desk's question reached the simulated user as a *user* turn, its own opening as an assistant turn
    assert seen.index("assistant\n" + HOTEL["responses_create_params"]["input"][1]["content"]) < seen.index("user\nWho am I speaking with?")

    PolicyUser.user = TextModel(done, smol_template)
    ended = run([turn("Anything else?")], PolicyUser, smol_template)
    assert (ended.reward, ended.verify_metrics["ended_by"]) == (0.0, "user")


def test_verify_scores_from_the_trajectory_alone() -> None:
    task = parse_task(HOTEL, index=0)
    call = {"type": "function_call", "id": "c", "call_id": "c", "name": "submit_request", "status": "completed",
            "arguments": json.dumps({"fields": FIELDS})}
    assert UserSimEnvironment().verify(task, [call]).reward == 1.0
    assert UserSimEnvironment().verify(task, [{**call, "arguments": "{not json"}]).reward == 0.0
    assert UserSimEnvironment().verify(task, []).reward == 0.0
    assert matches({"a": " X  y", "extra": 1}, {"a": "x y"}) and not matches({}, {"a": "x"})


def test_prepare_rows_is_seeded_disjoint_and_loads() -> None:
    train = UserSimEnvironment.prepare_rows(split="train", size=30, seed=5)
    assert train == UserSimEnvironment.prepare_rows(split="train", size=30, seed=5)
    validation = UserSimEnvironment.prepare_rows(split="validation", size=5, seed=5)
    key = lambda rows: {json.dumps(row["expected_request"], sort_keys=True) for row in rows}  # noqa: E731
    assert not key(train) & key(validation)
    assert {row["scenario"] for row in train} == {"hotel", "restaurant", "clinic", "taxi"}
    for row in train:
        task = parse_task(row, index=0)
        assert task.tools and task.tools[0]["name"] == "submit_request"
        assert set(row["expected_request"]) <= set(task.messages[0]["content"].replace(",", " ").replace(".", " ").split())


def test_a_user_served_by_base_url_and_model_replies(smol_template, smol_tokenizer, turn) -> None:
    """Issue 19 item 9: `user_base_url` + `user_model` loads the simulated user over `/v1/completions`
    (it used to fail every rollout with a TypeError from unpacking the tokenizer)."""
    from gym_bridge.serve.model_server import build_app
    from tests.support.http_server import app_in_thread
    from tests.support.scripted_model import ScriptedModel

    reply = smol_tokenizer.encode(f"I am {FIELDS['guest_name']}.", add_special_tokens=False) + [smol_tokenizer.eos_token_id]
    model = ScriptedModel(smol_tokenizer, lambda prompt, request: Generation(reply, [-0.1] * len(reply), "stop"))
    with app_in_thread(build_app(model, model_name="served-user")) as url:
        served = type("ServedUser", (UserSimEnvironment,), {"simulator": "policy", "user_base_url": url + "/v1", "user_model": "served-user"})
        record = run([turn("Who am I speaking with?"), turn(submit(FIELDS))], served, smol_template)
    assert record.reward == 1.0 and user_lines(record) == [f"I am {FIELDS['guest_name']}."]
    assert "role-playing a USER" in smol_tokenizer.decode(list(model.requests[0].prompt_ids))
