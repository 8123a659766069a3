"""The async worker's end-of-run rule: with a row budget (the rows the trainer will take) it starts no group beyond it,
so every started rollout's rows reach the trainer; a failed rollout reopens the budget; the budget follows TRL's
config (`max_steps`, the batch, accelerate's one micro-batch fetched ahead) and a resumed checkpoint's steps."""

from __future__ import annotations

import json
import queue
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("trl.experimental.async_grpo", reason="needs TRL >= 1.16")

from gym_bridge.core.errors import ConfigError  # noqa: E402
from gym_bridge.trl._async.checkpoint import checkpoint_step, restore_async_worker  # noqa: E402
from gym_bridge.trl._async.settings import AsyncWorkerSettings, row_budget_for  # noqa: E402
from gym_bridge.core.agent_loop import Limits  # noqa: E402
from gym_bridge.core.policy import SamplingParams  # noqa: E402
from gym_bridge.core.task import parse_task  # noqa: E402
from gym_bridge.policies.remote import RemotePolicy  # noqa: E402
from gym_bridge.trl._async.worker import AsyncRolloutWorker  # noqa: E402
from tests.support.failing_env import RaisesOneInEight  # noqa: E402
from tests.support.http_server import app_in_thread  # noqa: E402
from tests.support.vllm_async_stand_in import AsyncVLLMStandIn  # noqa: E402
from tests.trl.test_async_worker import mixed_tasks, take  # noqa: E402


def budget_worker(url, template, tasks, *, row_budget):
    settings = AsyncWorkerSettings(group_size=4, max_staleness=2, rows_per_version=4, sampling=SamplingParams(max_new_tokens=64),
                                   limits=Limits(max_turns=3, max_completion_tokens=512), row_budget=row_budget)
    return AsyncRolloutWorker(tasks, RemotePolicy(url + "/v1", model="stub"), template, settings)


def run_to_budget(worker, rows):
    """Take `rows` rows as a trainer of 4 rows per step would, then give the worker time to (wrongly) start more."""
    worker.update_model_version(1)
    worker.start()
    try:
        for step in range(rows // 4):
            take(worker, 4)
            worker.update_model_version(2 + step)
        time.sleep(0.5)  # a worker with no end would start the next group within a few milliseconds
        left = []
        while True:
            try:
                left.append(worker.rollout_buffer.get_nowait())
            except queue.Empty:
                break
        return left, set(worker.admission.admitted), worker.window.pushed
    finally:
        worker.stop()


def test_no_group_starts_beyond_the_row_budget_and_every_started_row_is_trained(smol_template, smol_tokenizer):
    """Budget 12 rows, groups of 4: exactly 3 groups start and all 12 rows go to the trainer; none is left running or
    waiting (without the rule the worker runs on while the trainer takes its last rows: 16 and more started)."""
    stand_in = AsyncVLLMStandIn(smol_tokenizer, token_delay_s=0.001)
    with app_in_thread(stand_in.app) as url:
        worker = budget_worker(url, smol_template, mixed_tasks()[:2], row_budget=12)
        left, in_flight, pushed = run_to_budget(worker, 12)
    assert pushed == 12 and worker.counts["rows"] == 12  # 3 groups of 4, every row pushed
    assert left == [] and in_flight == set()  # nothing done and waiting, nothing still running
    assert worker.counts["forced_admissions"] == 0


def test_a_failed_rollout_reopens_the_budget(smol_template, smol_tokenizer):
    """An environment failing in 1 of 8 rollouts: the first group pushes 3 rows, so a third group starts for the
    8 rows the trainer needs (2 groups would leave it waiting forever)."""
    RaisesOneInEight.setups = 0
    stand_in = AsyncVLLMStandIn(smol_tokenizer, token_delay_s=0.001)
    flaky = parse_task({"prompt": "What is 2 + 3?", "environment": RaisesOneInEight.name}, index=0)
    with app_in_thread(stand_in.app) as url:
        worker = budget_worker(url, smol_template, [flaky], row_budget=8)
        left, in_flight, pushed = run_to_budget(worker, 8)
    assert worker.counts["failed"] >= 1
    assert pushed >= 8 and pushed - len(left) == 8 and in_flight == set()  # 3 groups: 3 + 4 + 4 rows, 8 trained


def trl_args(**overrides):
    values = dict(max_steps=3, per_device_train_batch_size=4, gradient_accumulation_steps=2, world_size=2, token_budget=0)
    return SimpleNamespace(**{**values, **overrides})


def test_the_row_budget_follows_trls_config():
    # 3 steps x (4 rows x 2 ranks x 2 accumulation) = 48, plus one micro-batch of 4 x 2 fetched ahead = 56
    assert row_budget_for(trl_args()) == 56
    assert row_budget_for(trl_args(), steps_done=2) == 16 + 8  # a checkpoint at step 2: one step left
    assert row_budget_for(trl_args(max_steps=-1)) is None  # TRL stops by epochs: no end known
    assert row_budget_for(trl_args(token_budget=None)) is None  # a token budget packs a varying number of rows
    with pytest.raises(ConfigError, match="row_budget"):
        AsyncWorkerSettings(group_size=4, max_staleness=1, rows_per_version=4, row_budget=0)


def test_a_checkpoints_step_is_read_from_its_trainer_state(tmp_path):
    assert checkpoint_step(tmp_path) == 0
    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": 7}))
    assert checkpoint_step(tmp_path) == 7
    (tmp_path / "trainer_state.json").write_text("{")
    with pytest.raises(ConfigError, match="trainer_state.json"):
        checkpoint_step(tmp_path)


def test_a_restarted_trainer_gives_its_worker_the_budget_of_the_steps_left(tmp_path, smol_template):
    """A checkpoint at step 2 of 3 (no worker state in it): one step of 16 rows is left, plus the micro-batch of 8."""
    worker = budget_worker("http://127.0.0.1:9", smol_template, mixed_tasks()[:1], row_budget=row_budget_for(trl_args()))
    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    trainer = SimpleNamespace(args=trl_args(output_dir=str(tmp_path)), model_version=0)
    assert restore_async_worker(trainer, worker, str(tmp_path)) == str(tmp_path)
    assert worker.settings.row_budget == worker.admission.row_budget == 24
