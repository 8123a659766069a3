"""recipes/trl_async_grpo.py's checkpoint resume, run for real: its CPU config on a tiny model against the vLLM
stand-in, journaling and saving a checkpoint each step; trained one step (the worker's end-of-run rule off, so the end
of training cuts the groups in flight mid-episode, as a crash would), then started again with `resume_from_checkpoint=true` for a second. The restarted run goes on
counting policy versions from the checkpoint's, and the groups the first run left continue from their last turn,
their committed turns keeping their versions. The worker's bookkeeping of which groups a checkpoint covers is
checked on its own below."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl.experimental.async_grpo", reason="needs TRL >= 1.16")

from gym_bridge.core.errors import ConfigError  # noqa: E402
from gym_bridge.trl._async.checkpoint import STATE_FILE  # noqa: E402
from gym_bridge.trl._async.ledger import GroupLedger, WorkerState  # noqa: E402
from tests.support.http_server import app_in_thread  # noqa: E402
from tests.support.vllm_async_stand_in import AsyncVLLMStandIn  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "recipes" / "configs" / "trl_async_grpo_cpu.yaml"


@pytest.fixture(scope="module")
def recipe():
    spec = importlib.util.spec_from_file_location("trl_async_grpo_recipe", REPO / "recipes" / "trl_async_grpo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def versions(record: dict) -> list[int]:
    return [item["policy_version"] for item in record["response"]["output"] if "generation_token_ids" in item]


def test_the_recipe_resumes_from_its_checkpoint_and_continues_the_groups_in_flight(recipe, tmp_path, tiny_model_dir, smol_tokenizer,
                                                                                    monkeypatch, capsys):
    stand_in = AsyncVLLMStandIn(smol_tokenizer, token_delay_s=0.002)  # generation slow enough to leave groups in flight
    with app_in_thread(stand_in.app) as url:
        def run(*overrides: str) -> str:
            common = [f"model={tiny_model_dir}", f"server.url={url}", "server.launch=false", "server.served_model=stub",
                      f"async_grpo.output_dir={tmp_path}", "async_grpo.per_device_train_batch_size=4",
                      "async_grpo.max_completion_length=48", "async_grpo.save_strategy=steps", "async_grpo.save_steps=1",
                      "gym_bridge.journal=true"]
            argv = ["trl_async_grpo.py", "--config", str(CONFIG)] + [f"--set={o}" for o in common + list(overrides)]
            monkeypatch.setattr(sys, "argv", argv)
            recipe.main()
            return capsys.readouterr().out

        assert "trained 1 steps" in run("async_grpo.max_steps=1", "gym_bridge.end_of_run=false")
        saved = WorkerState.from_dict(json.loads((tmp_path / "checkpoint-1" / STATE_FILE).read_text()))
        assert saved.model_version == 2  # the first sync and one per step
        assert (tmp_path / "rollout_journal").is_dir()  # groups left in flight, or pushed and not covered
        first_run = len((tmp_path / "rollouts.jsonl").read_text().splitlines())
        assert "trained 2 steps" in run("async_grpo.max_steps=2", "resume_from_checkpoint=true")
    last = WorkerState.from_dict(json.loads((tmp_path / "checkpoint-2" / STATE_FILE).read_text()))
    assert last.model_version == saved.model_version + 2  # went on counting: the restart's sync, then one step
    covered = {group for group in range(16) if saved.covers(group)}
    assert covered < {group for group in range(16) if last.covers(group)}  # the second run went on, skipping none
    restarted = saved.model_version + 1
    records = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()[first_run:]]
    resumed = [record for record in records if record["metrics"].get("resumed_from_turn")]
    assert resumed, "no rollout of the first run continued mid-episode"
    for record in records:
        turn = record["metrics"].get("resumed_from_turn") or 0
        assert all(v < restarted for v in versions(record)[:turn]) and all(v >= restarted for v in versions(record)[turn:])
    assert all(record["metrics"]["attempts"] >= 2 for record in resumed)


def test_a_checkpoint_covers_the_groups_whose_rows_were_all_taken_and_a_restart_skips_them():
    ledger = GroupLedger()
    for group in (0, 1, 2, 3):
        ledger.pushed(group, 2)
    for group in (0, 0, 2, 2, 3):  # group 1 untaken, group 3 half taken: 0 and 2 are done
        ledger.taken(group)
    state = ledger.state(model_version=7)
    assert state == WorkerState(next_group=1, taken_after=(2,), model_version=7)
    # the trainer trained only the first 3 rows it took (its data loader took one ahead): group 2 is not covered
    assert ledger.state(model_version=7, trained_rows=3) == WorkerState(next_group=1, taken_after=(), model_version=7)
    assert ledger.release(state) == [0, 2] and ledger.release(state) == []  # each group's journal dropped once
    ledger.pushed(4, 0)  # a group whose rollouts all failed has no rows: done at once

    restarted = GroupLedger(WorkerState.from_dict(state.to_dict()))
    order = restarted.order([3, 5])  # groups 3 and 5 left in the journal: first, then on from 1 skipping 2, 3 and 5
    assert [next(order) for _ in range(6)] == [3, 5, 1, 4, 6, 7]
    restarted.pushed(1, 1)
    restarted.taken(1)
    assert restarted.state(model_version=8) == WorkerState(next_group=3, taken_after=(), model_version=8)
    fresh = GroupLedger().order([2])  # no checkpoint: on from the last resumed group, as before
    assert [next(fresh) for _ in range(3)] == [2, 3, 4]
    with pytest.raises(ConfigError, match="checkpoint-9"):
        WorkerState.from_dict({"version": 1, "next_group": "x"}, source="checkpoint-9/state.json")


def test_resume_true_skips_a_checkpoint_cut_off_while_being_saved(tmp_path, caplog):
    """A trainer killed while saving leaves a `checkpoint-N` folder without its worker state (Trainer writes the folder
    in place, the callback writes the state last): `resume_from_checkpoint: true` resumes from the latest whole one.
    The trainer is a stand-in namespace (the function reads `args.output_dir` and sets `model_version`); the worker
    is the real one, not started."""
    import logging
    from types import SimpleNamespace

    from gym_bridge.trl._async.checkpoint import restore_async_worker, save_worker_state
    from tests.support.async_trainer import worker_for

    out = tmp_path / "out"
    trainer = SimpleNamespace(args=SimpleNamespace(output_dir=str(out)), model_version=0)
    worker = worker_for(tmp_path, "http://127.0.0.1:9")
    with pytest.raises(ConfigError, match="holds no checkpoint"):
        restore_async_worker(trainer, worker, True)
    for step in (1, 2, 3):
        (out / f"checkpoint-{step}").mkdir(parents=True)
    (out / "checkpoint-3" / "config.json").write_text("{}")  # the kill came while checkpoint-3 was being written
    assert restore_async_worker(trainer, worker, True) == str(out / "checkpoint-3")  # no worker state anywhere: the latest
    save_worker_state(WorkerState(next_group=2, taken_after=(), model_version=3), out / "checkpoint-2")
    with caplog.at_level(logging.WARNING, logger="gym_bridge.trl._async.checkpoint"):
        assert restore_async_worker(trainer, worker, True) == str(out / "checkpoint-2")
    assert "checkpoint-3" in caplog.text and "cut off" in caplog.text
    assert trainer.model_version == 3 and worker.model_version == 3
