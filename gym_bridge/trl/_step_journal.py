"""The journal of TRL's synchronous rollout function: a trainer restarted from its checkpoint continues the batch in flight.

TRL 1.16's GRPOTrainer generates a step's batch from the dataloader's batch (its sampler is seeded; a resumed `Trainer`
skips the batches of the steps already trained) with the weights of that moment, and after a restart from checkpoint N
it generates again (`_buffered_inputs` is None) the batch of step N + 1 with checkpoint N's weights: the batch the
crashed run was generating, or training on, when the crash came right after checkpoint N. So each rollout is keyed by
the trainer step and its place in the rank's batch (its row and repeat as the sampler lays them out again; a row the
dataset holds twice stays two rollouts), and continues only if its prompt matches too; a batch's journal is kept until the next batch starts (a crash during its
optimizer step still finds it), and the journal of any other step is dropped, never continued under other weights.
When training ends normally (`end_callback`), the last batch's journal is removed: nothing is left to continue.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gym_bridge.core.engine import EngineConfig
from gym_bridge.core.journal import RolloutKey, RunFingerprint, RunJournal, open_journal


class StepJournal:
    """One rank's journal (`<journal_dir>/rank<N>`), which the rollout function's engine commits to (`Engine(...,
    journal=step_journal.journal)`), kept batch by batch."""

    def __init__(self, journal: RunJournal) -> None:
        self.journal = journal
        self._kept: list[RolloutKey] = journal.pending()
        """The rollouts the journal holds that no later batch has dropped: the last batch's, or a killed run's."""
        self.ended = False
        """Set by `end`: the journal is closed, and later batches are not journaled."""

    @classmethod
    def open(cls, journal_dir: str | Path, *, rank: int, config: EngineConfig) -> StepJournal:
        """Prepare the rank's journal over what a killed run left, for an engine of `config`. Raises JournalError for a
        damaged journal or one of another run (another model or other rollout settings)."""
        return cls(open_journal(Path(journal_dir) / f"rank{rank}", RunFingerprint.of_engine(config, [])))

    @staticmethod
    def keys(step: int, rollouts: int) -> list[RolloutKey]:
        """The keys of a batch of `rollouts` generated at trainer step `step`: the step and each one's place."""
        return [RolloutKey.of_step(step, position) for position in range(rollouts)]

    async def begin(self, keys: Sequence[RolloutKey]) -> None:
        """A batch of `keys` starts (on the engine's loop): drop the journal of every other rollout it holds."""
        wanted = set(keys)
        for key in self._kept:
            if key not in wanted:
                self.journal.finish(key)
        self._kept = list(keys)

    async def end(self) -> None:
        """Training ended normally (on the engine's loop): drop every rollout the journal holds and remove its files
        (the rank's folder, and `journal_dir` once no rank's folder is left in it). Later batches are not journaled."""
        for key in self._kept:
            self.journal.finish(key)
        self._kept = []
        self.ended = True
        await self.journal.close(complete=True)
        try:
            self.journal.directory.parent.rmdir()
        except OSError:
            pass  # another rank's folder is still there (it removes the parent when it ends), or it is already gone

    def end_callback(self) -> Any:
        """A `TrainerCallback` for `trainer.add_callback` that calls `end` when training ends normally (a crash or a
        kill never reaches `on_train_end`, so the journal stays for the restart)."""
        from transformers import TrainerCallback

        from gym_bridge.trl._backend import LOOP

        step_journal = self

        class EndStepJournal(TrainerCallback):
            """Removes the rollout function's journal at the end of training."""

            def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                LOOP.run(step_journal.end())

        return EndStepJournal()
