"""The TRL async worker journals by default where it generates on the trainer's vLLM server (issue 39 item 5):
`for_trainer` puts the journal in `<output_dir>/rollout_journal`; a worker given its own policy (in process) does
not journal unless told; `journal_dir=False` turns it off."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("trl.experimental.async_grpo", reason="needs TRL >= 1.16")

from gym_bridge.core.task import load_tasks  # noqa: E402
from gym_bridge.trl._async.worker import AsyncRolloutWorker  # noqa: E402
from tests.support.resume_kit import TurnPolicy  # noqa: E402

ROOT = Path(__file__).parents[2]


def worker(tmp_path, tokenizer, **options) -> AsyncRolloutWorker:
    args = SimpleNamespace(num_generations=4, max_staleness=2, per_device_train_batch_size=4, token_budget=0,
                           gradient_accumulation_steps=1, weight_sync_steps=1, max_completion_length=64, temperature=1.0,
                           top_p=1.0, top_k=0, vllm_server_base_url="http://127.0.0.1:9", request_timeout=30,
                           output_dir=str(tmp_path / "out"))
    tasks = load_tasks(ROOT / "environments/arithmetic/data/example.jsonl", limit=1)
    return AsyncRolloutWorker.for_trainer(args, tasks=tasks, tokenizer=tokenizer, served_model="m", **options)


def test_the_worker_journals_by_default_over_the_trainers_server(tmp_path, smol_tokenizer, smol_template):
    # before: journal_dir defaulted to None everywhere (no journal unless asked)
    assert worker(tmp_path, smol_tokenizer).settings.journal_dir == str(tmp_path / "out" / "rollout_journal")
    assert worker(tmp_path, smol_tokenizer, journal_dir=False).settings.journal_dir is None
    assert worker(tmp_path, smol_tokenizer, journal_dir=tmp_path / "j").settings.journal_dir == str(tmp_path / "j")
    in_process = worker(tmp_path, smol_tokenizer, policy=TurnPolicy(smol_template, []))
    assert in_process.settings.journal_dir is None
