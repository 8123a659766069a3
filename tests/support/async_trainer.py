"""A trainer process for restart tests: drives gym_bridge's AsyncRolloutWorker the way TRL 1.16's AsyncGRPOTrainer does.

As the trainer: the policy version restored from the checkpoint, a weight sync, then `worker.start()`; rows taken from
`rollout_buffer` (with `check_health` while it waits, rows older than `max_staleness` dropped); a weight sync after each
optimizer step, which bumps the version and calls `update_model_version`. Stand-in parts: the optimizer step records
the rows it took and sleeps instead of training, and a checkpoint (`checkpoint.json`, written atomically with the worker's
`checkpoint_state`, as `worker_checkpoint_callback` saves it) follows every weight sync, the first one included, so a
version number names one set of weights across restarts. The model is a server on `url` (`/v1/completions`).

    python -m tests.support.async_trainer WORK_DIR URL STEPS     # or main([...]) in a forked child
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import queue
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
GROUP_SIZE = 2
MAX_STALENESS = 8
TASKS = 64
"""Rows: the multi_step examples, each user message ending with `(request N)`, so every group's prompts are its own."""
ROWS_PER_STEP = GROUP_SIZE
ROWS_PER_VERSION = 1
STEP_S = 0.05
"""An optimizer step's time: meanwhile the worker runs ahead, its rows waiting in the buffer."""
"""What the worker counts on the trainer taking per version at least (it takes ROWS_PER_STEP): a smaller window."""


def worker_for(work: Path, url: str) -> Any:
    """The worker as a restarted trainer builds it: same rows, settings and journal directory."""
    from gym_bridge.core.agent_loop import Limits
    from gym_bridge.core.task import load_tasks, parse_task
    from gym_bridge.core.template.chat_template import ChatTemplate
    from gym_bridge.policies.embedded import load_embedded_tokenizer
    from gym_bridge.policies.remote import RemotePolicy
    from gym_bridge.trl import AsyncRolloutWorker, AsyncWorkerSettings

    examples = load_tasks(ROOT / "environments/multi_step/data/example.jsonl")
    tasks = [parse_task(marked(examples[index % len(examples)].row, index), index=index) for index in range(TASKS)]
    settings = AsyncWorkerSettings(group_size=GROUP_SIZE, max_staleness=MAX_STALENESS, rows_per_version=ROWS_PER_VERSION,
                                   limits=Limits(max_turns=6, max_completion_tokens=2048), max_concurrency=16,
                                   model_name="scripted", records_path=str(work / f"records-{os.getpid()}.jsonl"),
                                   journal_dir=str(work / "journal"))
    return AsyncRolloutWorker(tasks, RemotePolicy(url, model="scripted"), ChatTemplate(load_embedded_tokenizer()), settings)


def marked(row: dict[str, Any], index: int) -> dict[str, Any]:
    """`row` with `(request <index>)` after its last message."""
    row = copy.deepcopy(row)
    row["responses_create_params"]["input"][-1]["content"] += f" (request {index})"
    return row


def save(path: Path, checkpoint: dict[str, Any]) -> None:
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("w") as handle:
        json.dump(checkpoint, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def take(worker: Any, version: int, dropped: list[int]) -> Any:
    """One row, as TRL's RolloutQueueDataset takes it: health checked while waiting, stale rows dropped."""
    while True:
        try:
            sample = worker.rollout_buffer.get(timeout=0.2)
        except queue.Empty:
            worker.check_health(60)
            continue
        if version - int(sample.model_version) > MAX_STALENESS:
            dropped.append(int(sample.group_id))
            continue
        return sample


def main(argv: list[str]) -> None:
    from gym_bridge.trl._async.ledger import WorkerState

    work, url, steps = Path(argv[0]), argv[1], int(argv[2])
    path = work / "checkpoint.json"
    checkpoint = json.loads(path.read_text()) if path.exists() else {"step": 0, "model_version": 0, "worker": None, "rows": [], "dropped": []}
    worker = worker_for(work, url)
    worker.follow_checkpoints()
    if checkpoint["worker"] is not None:
        worker.restore_checkpoint_state(WorkerState.from_dict(checkpoint["worker"]))
    version = int(checkpoint["model_version"])
    worker.update_model_version(version)

    def sync(rows: list[dict[str, Any]]) -> int:
        """The weight sync after a step (or at train begin): checkpointed, then the worker told."""
        progress = dataclasses.replace(worker.checkpoint_state(), model_version=version + 1)
        checkpoint.update(model_version=version + 1, worker=progress.to_dict(), rows=checkpoint["rows"] + rows)
        save(path, checkpoint)
        worker.checkpoint_saved(progress)
        worker.update_model_version(version + 1)
        return version + 1

    version = sync([])
    with (work / "starts.jsonl").open("a") as starts:
        starts.write(json.dumps({"pid": os.getpid(), "version": version, "step": checkpoint["step"]}) + "\n")
    worker.start()
    try:
        while checkpoint["step"] < steps:
            dropped: list[int] = []
            samples = [take(worker, version, dropped) for _ in range(ROWS_PER_STEP)]
            rows = [{"group_id": int(s.group_id), "input_ids": s.input_ids.tolist(), "completion_mask": s.completion_mask.tolist(),
                     "old_log_probs": s.old_log_probs.tolist(), "model_version": int(s.model_version), "taken_at": version}
                    for s in samples]
            time.sleep(STEP_S)
            checkpoint["step"] += 1
            checkpoint["dropped"] = checkpoint["dropped"] + dropped
            version = sync(rows)
    finally:
        worker.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
