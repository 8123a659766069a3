"""How the async worker generates and how far ahead of its trainer it may run, set directly or from an `AsyncGRPOConfig`.

`AsyncWorkerSettings` is the worker's whole configuration; `AsyncRolloutWorker.for_trainer` fills it from TRL's config through
the mapping the synchronous adapter uses too (`gym_bridge.trl._trainer_args`: sampling, limits, rows per version), so
a config samples the same way on either path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.errors import ConfigError
from gym_bridge.core.policy import SamplingParams
from gym_bridge.trl._async.admission import RowVersion
from gym_bridge.trl._trainer_args import rows_per_step

__all__ = ["AsyncWorkerSettings", "journal_dir_for", "row_budget_for"]


@dataclass(frozen=True)
class AsyncWorkerSettings:
    """How the worker generates and how far ahead of the trainer it may run."""

    group_size: int
    """Rollouts per task (TRL's `num_generations`)."""
    max_staleness: int
    """The trainer's `max_staleness`: rows whose version (`row_version`) is older than this are dropped, so none is generated."""
    rows_per_version: int
    """Rows the trainer takes at least per version: samples per optimizer step times `weight_sync_steps`."""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    limits: Limits = field(default_factory=Limits)
    max_concurrency: int = 64
    """Rollouts running at once (the window may allow fewer)."""
    deadline_s: float = 600.0
    model_name: str = ""
    records_path: str | None = None
    """Append each rollout's record (with `metrics.consumed_version`) when the trainer takes its first row."""
    row_version: RowVersion = "last_call"
    """Which version a row carries for TRL's `max_staleness` (`gym_bridge.trl._async.admission`): its last model
    call's (a long episode goes on across weight syncs and is kept) or its first call's (its oldest token's)."""
    journal_dir: str | None = None
    """Commit each finished turn of the rollouts in flight here (`gym_bridge.core.journal`): a worker started over the
    same directory (the trainer restarted from its checkpoint) first runs the groups left in flight, each rollout from
    its last committed turn with its earlier turns' policy versions, then goes on with the groups after them."""
    row_budget: int | None = None
    """Rows the trainer will take from this worker in all (`row_budget_for`: TRL's `max_steps` times the rows per step,
    plus the batch its data loader fetches ahead); None: no end. No group starts once the rows pushed and those the
    groups in flight reserve cover it, so every started episode is trained and nothing is generated to be thrown away."""

    def __post_init__(self) -> None:
        if self.row_version not in get_args(RowVersion):
            raise ConfigError(f"row_version must be one of {', '.join(map(repr, get_args(RowVersion)))}, got {self.row_version!r}")
        if self.row_budget is not None and self.row_budget < 1:
            raise ConfigError(f"row_budget must be at least 1 (or None: no end), got {self.row_budget}")
        if self.group_size < 1:
            raise ConfigError(f"group_size (num_generations) must be at least 1, got {self.group_size}")
        if self.group_size > (self.max_staleness + 1) * self.rows_per_version:
            raise ConfigError(f"a group of {self.group_size} rows never fits in (max_staleness + 1) * rows_per_version = "
                             f"{(self.max_staleness + 1) * self.rows_per_version} rows: set AsyncGRPOConfig(token_budget=0) (then a step "
                             "takes per_device_train_batch_size rows per rank), or raise max_staleness or the batch size")


def journal_dir_for(given: str | Path | Literal[False] | None, args: Any, *, over_server: bool) -> str | None:
    """`for_trainer`'s journal: as given (False: none), else on where a server generates (a commit costs about 1%
    there), in `<output_dir>/rollout_journal` beside the trainer's checkpoints."""
    if given is None and over_server and getattr(args, "output_dir", None):
        return str(Path(args.output_dir) / "rollout_journal")
    return str(given) if given else None


def row_budget_for(args: Any, *, steps_done: int = 0) -> int | None:
    """The rows an `AsyncGRPOConfig` trainer still takes from its worker: its `max_steps` optimizer steps less
    `steps_done` (a resumed checkpoint's), each of `rows_per_step` rows, plus one micro-batch for all ranks, which
    accelerate's dispatching data loader fetches before it hands out the last one. None (no end) when the count is not
    known in advance: no `max_steps` (TRL then stops by epochs of its dataset) or a token budget (a varying number of
    rows per step)."""
    max_steps = int(getattr(args, "max_steps", 0) or 0)
    per_step = rows_per_step(args) if max_steps > 0 else None
    if per_step is None:
        return None
    micro_batch = per_step // int(args.gradient_accumulation_steps)
    return max(max_steps - steps_done, 0) * per_step + micro_batch
