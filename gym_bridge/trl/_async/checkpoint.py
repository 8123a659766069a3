"""The async worker's progress in TRL's checkpoints, so `trainer.train(resume_from_checkpoint=...)` goes on where it left.

TRL 1.16's AsyncGRPOTrainer saves its own worker's prompt index and policy version (`rollout_state.json`) but nothing
for a worker passed as `rollout_worker`: restarted, it would count versions from 0 again and the worker would start
over from its first group. `worker_checkpoint_callback` writes the worker's `WorkerState` into each checkpoint folder
(then drops the journal of the groups it covers); `restore_async_worker` reads it back into the trainer and worker.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from gym_bridge.core.errors import ConfigError
from gym_bridge.trl._async.worker import AsyncRolloutWorker
from gym_bridge.trl._async.ledger import WorkerState
from gym_bridge.trl._async.settings import row_budget_for
from gym_bridge.trl._trainer_args import rows_per_step

STATE_FILE = "gym_bridge_worker_state.json"
"""In each checkpoint folder, next to TRL's files."""

logger = logging.getLogger(__name__)


def save_worker_state(state: WorkerState, checkpoint_dir: str | Path) -> Path:
    """Write `state` into `checkpoint_dir` atomically (a temporary file fsynced, then renamed); returns its path."""
    path = Path(checkpoint_dir) / STATE_FILE
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("w") as handle:
        json.dump(state.to_dict(), handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    return path


def load_worker_state(checkpoint_dir: str | Path) -> WorkerState | None:
    """The worker state a checkpoint folder holds; None when it holds none (saved without the callback).
    Raises ConfigError naming the file when it cannot be read."""
    path = Path(checkpoint_dir) / STATE_FILE
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ConfigError(f"{path}: cannot read the worker state ({error}); remove it to restart the worker's groups") from error
    return WorkerState.from_dict(data, source=str(path))


def worker_checkpoint_callback(worker: AsyncRolloutWorker) -> Any:
    """A `TrainerCallback` for `trainer.add_callback`: at each checkpoint save, the worker's state goes into the
    checkpoint folder, then the journal of the groups it covers is dropped. Tells the worker to keep each group's
    journal until then (`follow_checkpoints`), so call it before training starts."""
    from transformers import TrainerCallback

    worker.follow_checkpoints()

    class WorkerCheckpoint(TrainerCallback):
        """Saves gym_bridge's async worker state with each checkpoint."""

        start_step = 0

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.start_step = int(state.global_step)  # the checkpoint's step when resuming

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if not state.is_world_process_zero:
                return
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if not folder.is_dir():
                logger.warning("gym_bridge: no checkpoint folder %s to save the worker state in", folder)
                return
            per_step = rows_per_step(args)
            trained = None if per_step is None else (int(state.global_step) - self.start_step) * per_step
            progress = worker.checkpoint_state(trained_rows=trained)
            save_worker_state(progress, folder)
            worker.checkpoint_saved(progress)

    return WorkerCheckpoint()


def restore_async_worker(trainer: Any, worker: AsyncRolloutWorker, resume_from_checkpoint: str | bool | None) -> str | None:
    """Give a restarted trainer and its worker the progress saved in the checkpoint `trainer.train` will resume from
    (`True`: the latest complete one under `args.output_dir`, see `last_checkpoint`); returns the folder to pass to
    `trainer.train(resume_from_checkpoint=...)`, or None to start from scratch. The trainer's `model_version` and the
    worker's go on from the saved version; the worker skips the groups the checkpoint covers. A checkpoint without a
    worker state (saved without the callback) starts the worker from its first group, with a warning. A worker with a
    row budget (`AsyncWorkerSettings.row_budget`) gets the budget of the steps left after the checkpoint's.

    Raises ConfigError when `True` finds no checkpoint."""
    if resume_from_checkpoint is None or resume_from_checkpoint is False:
        return None
    folder = str(resume_from_checkpoint)
    if resume_from_checkpoint is True:
        folder = str(last_checkpoint(trainer.args.output_dir))
    if worker.settings.row_budget is not None:  # the checkpoint's steps are trained: their rows are not needed again
        worker.set_row_budget(row_budget_for(trainer.args, steps_done=checkpoint_step(folder)))
    state = load_worker_state(folder)
    if state is None:
        logger.warning("gym_bridge: %s holds no %s; the rollout worker starts from its first group at version 0", folder, STATE_FILE)
        return folder
    worker.restore_checkpoint_state(state)
    trainer.model_version = state.model_version
    return folder


def checkpoint_step(folder: str | Path) -> int:
    """The optimizer steps a checkpoint folder holds (`trainer_state.json`'s `global_step`; 0 without one)."""
    path = Path(folder) / "trainer_state.json"
    try:
        return int(json.loads(path.read_text())["global_step"]) if path.exists() else 0
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"{path}: cannot read global_step ({error})") from error


def last_checkpoint(output_dir: str | Path) -> Path:
    """The checkpoint `resume_from_checkpoint: true` resumes from: the latest `checkpoint-N` folder holding the worker
    state, which the callback writes after TRL's files, so the checkpoint is whole. A later folder without it was cut
    off while being saved (the process killed; `Trainer` writes a checkpoint in place, and `get_last_checkpoint` would
    pick it): skipped, with a warning. With no worker state in any folder (saved without the callback): the latest.

    Raises ConfigError when `output_dir` holds no checkpoint folder."""
    found = sorted((int(match.group(1)), path) for path in Path(output_dir).glob("checkpoint-*")
                   if path.is_dir() and (match := re.fullmatch(r"checkpoint-(\d+)", path.name)))
    if not found:
        raise ConfigError(f"resume_from_checkpoint: true, but {output_dir} holds no checkpoint-* folder")
    whole = [(step, path) for step, path in found if (path / STATE_FILE).exists()]
    if not whole:
        return found[-1][1]
    last_step, last = whole[-1]
    torn = [path.name for step, path in found if step > last_step]
    if torn:
        logger.warning("gym_bridge: %s hold no %s (cut off while being saved): resuming from %s", ", ".join(torn), STATE_FILE, last)
    return last
