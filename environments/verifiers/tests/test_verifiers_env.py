"""verifiers v1 through the capture endpoint: scripted plays scored as verifiers' own runner scores them, failures
of a v1 env as failure kinds that leave their siblings alone, and the pure parts (row checks, result reading)."""

from __future__ import annotations

import asyncio

import pytest

from environments.verifiers import VerifiersEnvironment, describe, episode_result, venv_python, worker_result
from environments.verifiers.tests.conformance import episode_reward, gym_bridge_rollout, own_runner, task
from gym_bridge import FailRollout, MissingExtraError

needs_venv = pytest.mark.skipif(not venv_python().exists(), reason="no .venv-verifiers: run `make verifiers-venv`")


@needs_venv
def test_a_winning_and_a_losing_play_score_what_vf_eval_scores(smol_template, turn, tmp_path) -> None:
    # gb_arithmetic task 0 is "What is 12 + 30?" (reward `correct`: 1.0 when the last number is 42), task 1 "What is 7 * 6?"
    win, lose = [turn("12 + 30 = 42")], [turn("7 * 6 = 41")]

    async def both() -> list:
        return await asyncio.gather(gym_bridge_rollout(smol_template, win, task("gb_arithmetic", 0)),
                                    gym_bridge_rollout(smol_template, lose, task("gb_arithmetic", 1)),
                                    own_runner(smol_template, win + lose, "gb_arithmetic", range(0, 2), tmp_path))

    won, lost, (own_win, own_loss) = asyncio.run(both())
    for record in (won, lost):
        assert record["failure_kind"] is None, record["failure_reason"]
    assert (won["reward"], lost["reward"]) == (episode_reward(own_win), episode_reward(own_loss)) == (1.0, 0.0)
    assert won["reward_components"] == {"correct": 1.0}
    # the tokens are gym_bridge's: the one answer, sampled by the policy, is what `tokens` trains
    assert won["tokens"]["completion_ids"] == win[0].token_ids and set(won["tokens"]["completion_mask"]) == {1}
    assert won["metrics"]["verify"]["verifiers_task"] == "arithmetic#0"


class QuickTimeout(VerifiersEnvironment):
    name = "verifiers_quick_timeout"
    harness_timeout_s = 60.0


def batch(template, script, rows, env_class=VerifiersEnvironment) -> list:
    async def all_rows() -> list:
        return await asyncio.gather(*(gym_bridge_rollout(template, script, row, env_class) for row in rows))

    return asyncio.run(all_rows())


@needs_venv
def test_bad_v1_envs_fail_their_own_rollout_only(smol_template, turn) -> None:
    rows = [task("gb_faults", 0, index=0), task("gb_faults", 1, index=1), task("no_such_taskset", 0, index=2),
            task("gb_arithmetic", 99, index=3)]
    fine, raised, unknown, past_end = batch(smol_template, [turn("42")], rows)
    assert fine["failure_kind"] is None and fine["reward"] == 1.0, fine["failure_reason"]
    assert raised["failure_kind"] == "env" and "RuntimeError: gb_faults: the env raised on purpose" in raised["failure_reason"]
    assert unknown["failure_kind"] == "env" and "no_such_taskset" in unknown["failure_reason"] and "not found" in unknown["failure_reason"]
    assert past_end["failure_kind"] == "env" and "no task at index 99" in past_end["failure_reason"]
    for record in (raised, unknown, past_end):
        assert record["mask_sample"] is True


@pytest.mark.slow
@needs_venv
def test_a_hanging_v1_env_times_out_beside_a_sibling_that_scores(smol_template, turn) -> None:
    fine, hung = batch(smol_template, [turn("42")], [task("gb_faults", 0, index=0), task("gb_faults", 2, index=1)], QuickTimeout)
    assert fine["failure_kind"] is None and fine["reward"] == 1.0, fine["failure_reason"]
    assert hung["failure_kind"] == "timeout" and "60 s" in hung["failure_reason"] and hung["mask_sample"] is True


def test_a_missing_virtualenv_is_refused_before_any_rollout_with_the_make_target(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(VerifiersEnvironment, "venv_dir", str(tmp_path / "absent"))
    with pytest.raises(MissingExtraError, match="make verifiers-venv"):
        VerifiersEnvironment.check_ready()
    assert VerifiersEnvironment().harness_command(task("gb_arithmetic", 0))[0] == str(tmp_path / "absent" / "bin" / "python")


def test_gym_bridge_envs_shows_the_install_command_when_the_venv_is_missing(tmp_path) -> None:
    assert "make verifiers-venv" in describe(tmp_path / "absent" / "python")
    (tmp_path / "python").touch()
    assert "make verifiers-venv" not in describe(tmp_path / "python")


def test_rows_may_pin_only_allowed_harnesses(monkeypatch) -> None:
    row = task("gb_arithmetic", 0).row
    row["verifiers"]["env"]["agent"] = {"harness": {"id": "bash"}}
    (problem,) = VerifiersEnvironment.validate_row(row)
    assert problem.field == "verifiers.env.agent.harness" and "allowed_harnesses" in problem.message
    monkeypatch.setattr(VerifiersEnvironment, "allowed_harnesses", ("null", "bash"))
    assert VerifiersEnvironment.validate_row(row) == []


def test_rows_must_name_a_v1_taskset_and_a_task_position() -> None:
    assert VerifiersEnvironment.validate_row(task("gb_arithmetic", 0).row) == []
    problems = {p.field for p in VerifiersEnvironment.validate_row({"verifiers": {"env": {"taskset": {}}, "task_idx": -1}})}
    assert problems == {"verifiers.env.taskset.id", "verifiers.task_idx"}
    assert [p.field for p in VerifiersEnvironment.validate_row({"verifiers": "gsm8k"})] == ["verifiers"]


def test_the_result_line_becomes_the_trainable_traces_reward() -> None:
    line = ('GYM_BRIDGE_VERIFIERS_RESULT {"env_id": "user-sim+t", "task_name": "t#0", "ok": true, "is_timeout": false, "errors": [],'
            ' "traces": [{"agent": "user", "trainable": false, "reward": 0.0, "rewards": {}, "metrics": {}, "errors": [], "turns": 2,'
            ' "is_timeout": false}, {"agent": "assistant", "trainable": true, "reward": 0.75, "rewards": {"a": {"score": 1.0, "weight": 0.5},'
            ' "b": {"score": 0.5, "weight": 0.5}}, "metrics": {"user_turns": 2.0}, "errors": [], "turns": 1, "is_timeout": false}]}')
    result = worker_result("log line\n" + line + "\n")
    assert result is not None and worker_result("no result here") is None
    verdict = episode_result(result)
    assert verdict.reward == 0.75 and verdict.reward_components == {"a": 0.5, "b": 0.25}  # 1.0 * 0.5 + 0.5 * 0.5
    assert verdict.metrics["verifiers_metric_user_turns"] == 2.0
    assert verdict.mask_sample is True  # two seats called the model: the trained segment might be the user's
    assert episode_result({**result, "traces": result["traces"][1:]}).mask_sample is False
    with pytest.raises(FailRollout, match="failed: HarnessError: boom") as failed:
        episode_result({**result, "ok": False, "errors": ["HarnessError: boom"]})
    assert failed.value.kind == "env"
    with pytest.raises(FailRollout) as deadline:
        episode_result({**result, "ok": False, "is_timeout": True, "errors": ["TimeoutError: run() exceeded its 5s deadline"]})
    assert deadline.value.kind == "timeout"
    with pytest.raises(FailRollout, match="2 trainable traces"):  # best-of-n: n attempts, each trainable
        episode_result({**result, "traces": [result["traces"][1]] * 2})


@pytest.mark.slow
@needs_venv
def test_user_sim_scores_the_assistant_as_vf_eval_does(smol_template, turn, tmp_path) -> None:
    # verifiers' user-sim env: the simulated user (same model, untrainable) asks, the assistant answers, the user ends
    script = [turn("What is 12 + 30?"), turn("It is 42"), turn("###DONE###")]

    async def both() -> list:
        return await asyncio.gather(gym_bridge_rollout(smol_template, script, task("gb_arithmetic", 0, env_id="user-sim")),
                                    own_runner(smol_template, script, "gb_arithmetic", range(0, 1), tmp_path, env_id="user-sim"))

    record, (own,) = asyncio.run(both())
    assert record["failure_kind"] is None, record["failure_reason"]
    assert record["reward"] == episode_reward(own) == 1.0
    verify = record["metrics"]["verify"]
    assert verify["model_calls"] == 3 and verify["verifiers_seats_calling_the_model"] == 2 and record["mask_sample"] is True


@pytest.mark.slow
@needs_venv
def test_a_multi_turn_game_is_one_token_in_segment_and_scores_as_vf_eval_does(smol_template, turn, tmp_path) -> None:
    # gb_guess task 0 hides 42: [50] -> "lower", [25] -> "higher", [42] wins; a reply without brackets is an invalid move
    win, invalid = [turn("[50]"), turn("[25]"), turn("[42]")], [turn("[50]"), turn("forty-two")]

    async def plays() -> list:
        return await asyncio.gather(gym_bridge_rollout(smol_template, win, task("gb_guess", 0)),
                                    gym_bridge_rollout(smol_template, invalid, task("gb_guess", 0)),
                                    own_runner(smol_template, win + invalid, "gb_guess", range(0, 1), tmp_path / "a", repeats=2))

    won, lost, own = asyncio.run(plays())
    assert [won["failure_kind"], lost["failure_kind"]] == [None, None], (won["failure_reason"], lost["failure_reason"])
    assert (won["reward"], lost["reward"]) == tuple(sorted(map(episode_reward, own), reverse=True)) == (1.0, 0.0)
    verify = won["metrics"]["verify"]
    assert verify["model_calls"] == 3 and verify["segments"] == 1 and verify["token_in_calls"] == 2
    # the three answers are trained (mask 1), the env's "lower" / "higher" turns between them are not (mask 0)
    tokens = won["tokens"]
    trained = [token for token, mask in zip(tokens["completion_ids"], tokens["completion_mask"]) if mask]
    assert trained == win[0].token_ids + win[1].token_ids + win[2].token_ids and 0 in tokens["completion_mask"]
