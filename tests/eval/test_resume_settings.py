"""What `--resume` does with the journal a run left: a rollout cut off by a server error continues from its committed
turns; a resume whose rollout settings differ (`--num-repeats`, an `--env-setting`) is refused, naming the setting and
both values, and the journal is left as it was. In process, with a scripted model (the CLI runs in test_kill_resume.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.environment import VerifyResult
from gym_bridge.core.errors import BackendAnswerError, GymBridgeError
from gym_bridge.core.journal import journal_dir_for
from gym_bridge.core.policy import Generation, GenerationRequest
from gym_bridge.core.registry import configure, get_environment, register
from gym_bridge.core.rollout_file import read_records
from gym_bridge.eval.run import run_eval, select_ready_tasks
from tests.eval.test_kill_resume import CALLS
from tests.support.resume_kit import Killed, TurnPolicy
from tests.support.scripted_model import finished_turns

MultiStep = get_environment("multi_step")


class Tunable(MultiStep):
    """multi_step with a setting of its own, as `--env-setting tunable_multi_step_for_test.level=N` changes it."""

    name = "tunable_multi_step_for_test"
    settings = ("level",)
    level = 1

    def verify(self, task, output):
        return VerifyResult(reward=1.0)


@pytest.fixture(autouse=True)
def tunable_registered():
    """Tunable takes multi_step's NeMo Gym aliases (its example rows route by them) for this module's tests only;
    registered at import, it routed every later test's multi_step rows to this class."""
    register(Tunable)
    yield
    register(MultiStep)


class FailingAt(TurnPolicy):
    """TurnPolicy whose call number `fail_at` fails as a model server's 503 does (an `infra` failure)."""

    def __init__(self, *args, fail_at: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fail_at = fail_at

    async def generate(self, request: GenerationRequest) -> Generation:
        if self.calls + 1 == self.fail_at:
            self.calls += 1
            raise BackendAnswerError("http://127.0.0.1:8000/v1/completions answered 503: overloaded")
        return await super().generate(request)


@pytest.fixture
def script(smol_tokenizer):
    return finished_turns(smol_tokenizer, CALLS)


def evaluate(policy, template, tasks, output: Path, **options):
    return asyncio.run(run_eval(Engine(policy, template, EngineConfig()), tasks, output=output, **options))


def killed(template, script, tasks, output: Path, **options) -> None:
    with pytest.raises(Killed):
        evaluate(TurnPolicy(template, script, kill_at=3), template, tasks, output, journal=True, **options)
    assert journal_dir_for(output).exists()


def test_a_rollout_failed_by_the_server_keeps_its_turns_and_resume_continues_it(tmp_path, smol_template, script):
    # before: its record dropped the journal, so --resume generated its 4 calls again from turn 0
    tasks, output = select_ready_tasks(env_names=["multi_step"], limit=1), tmp_path / "out.jsonl"
    evaluate(FailingAt(smol_template, script, fail_at=3), smol_template, tasks, output, journal=True)
    [failed] = read_records(output)
    assert failed["failure_kind"] == "infra" and journal_dir_for(output).exists()  # two turns committed, kept
    policy = TurnPolicy(smol_template, script)
    evaluate(policy, smol_template, tasks, output, resume=True)
    [record] = read_records(output)
    assert record["failure_kind"] is None and record["metrics"]["resumed_from_turn"] == 2 and policy.calls == 2
    assert not journal_dir_for(output).exists()


def test_a_resume_with_another_num_repeats_is_refused_naming_both_values(tmp_path, smol_template, script):
    # before: it ran with 1 repeat, exited 0 and dropped the journal's in-flight repeat 1 (issue 36 item 12)
    tasks, output = select_ready_tasks(env_names=["multi_step"], limit=1), tmp_path / "out.jsonl"
    killed(smol_template, script, tasks, output, num_repeats=2)
    before = sorted((path.name, path.stat().st_size) for path in journal_dir_for(output).iterdir())
    with pytest.raises(GymBridgeError, match=r"setting num_repeats \(journal: 2, this run: 1\)"):
        evaluate(TurnPolicy(smol_template, script), smol_template, tasks, output, resume=True, num_repeats=1)
    assert sorted((path.name, path.stat().st_size) for path in journal_dir_for(output).iterdir()) == before
    policy = TurnPolicy(smol_template, script)
    evaluate(policy, smol_template, tasks, output, resume=True, num_repeats=2)
    assert sorted(r["repeat_index"] for r in read_records(output)) == [0, 1] and policy.calls < 8


def test_a_resume_over_records_of_more_repeats_is_refused_and_writes_nothing(tmp_path, smol_template, script):
    # before: the run went on with 1 repeat; and a refused resume had already dropped the failed records from the file
    tasks, output = select_ready_tasks(env_names=["multi_step"], limit=1), tmp_path / "out.jsonl"
    evaluate(FailingAt(smol_template, script, fail_at=2), smol_template, tasks, output, num_repeats=3, journal=False)
    assert [r["failure_kind"] for r in read_records(output)].count("infra") == 1
    before = output.read_bytes()
    with pytest.raises(GymBridgeError, match="holds repeat 2 of a task.*--num-repeats 3 or more.*--num-repeats 1"):
        evaluate(TurnPolicy(smol_template, script), smol_template, tasks, output, resume=True, num_repeats=1, journal=False)
    assert output.read_bytes() == before


def test_a_resume_with_another_env_setting_is_refused_naming_both_values(tmp_path, smol_template, script):
    output = tmp_path / "out.jsonl"
    killed(smol_template, script, select_ready_tasks(env_names=[Tunable.name], limit=1), output)
    configure(Tunable.name, level=2)
    try:
        tasks = select_ready_tasks(env_names=[Tunable.name], limit=1)
        with pytest.raises(GymBridgeError, match=rf"setting env\.{Tunable.name}\.level \(journal: 1, this run: 2\)"):
            evaluate(TurnPolicy(smol_template, script), smol_template, tasks, output, resume=True)
    finally:
        register(Tunable)
