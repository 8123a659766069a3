"""The async worker's groups as the trainer's checkpoints and the rollout journal see them.

`GroupProgress` decides the order the groups run in (those a killed worker left in the journal first, then on from
the restored checkpoint's), tells the ledger what was pushed, and drops a group's journal once it is no longer
needed: when its rows are pushed, or, following the trainer's checkpoints, when a saved checkpoint covers them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from gym_bridge.core.journal import RolloutKey, RunFingerprint, RunJournal, open_journal
from gym_bridge.trl._async.ledger import GroupLedger, WorkerState

__all__ = ["GroupProgress"]


class GroupProgress:
    """The ledger of the groups pushed and taken, the journal of those in flight, and which groups run next.
    `ledger` is thread-safe; the journal is touched on the worker's loop only."""

    def __init__(self, group_size: int) -> None:
        self.group_size = group_size
        self.ledger = GroupLedger()
        self.journal: RunJournal | None = None
        self.follow_checkpoints = False
        """Keep a group's journal until a checkpoint covers it (not only until its rows are pushed)."""
        self.resumed: list[int] = []
        """Group ids a killed worker left in flight in the journal: run first, continued from their last turn."""
        self.covered: list[int] = []
        """Group ids the journal holds that the restored checkpoint says the trainer took: dropped from it at start."""

    def restore(self, state: WorkerState) -> None:
        """Go on from `state`'s groups (a restarted trainer's checkpoint)."""
        self.ledger = GroupLedger(state)

    def open_journal(self, journal_dir: str, fingerprint: RunFingerprint) -> RunJournal:
        """Open (or resume) the journal and sort the groups it left in flight into those to continue and those done."""
        self.journal = open_journal(journal_dir, fingerprint)
        pending = sorted({group_id for group_id, _ in self.journal.pending()})
        start = self.ledger.start
        self.covered = [group_id for group_id in pending if start is not None and start.covers(group_id)]
        self.resumed = [group_id for group_id in pending if group_id not in self.covered]
        return self.journal

    def order(self) -> Iterator[int]:
        """The group ids to run, in order (see `GroupLedger.order`)."""
        return self.ledger.order(self.resumed)

    def pushed(self, group_id: int, rows: int) -> None:
        """`rows` rows of `group_id` are about to enter the buffer (0: the group is done without rows)."""
        self.ledger.pushed(group_id, rows)

    def done(self, group_id: int) -> None:
        """`group_id`'s rows are in the buffer: its journal goes now, or when a checkpoint covers it when following them."""
        if not self.follow_checkpoints:
            self.finish([group_id])

    def finish(self, groups: Sequence[int]) -> None:
        """Drop `groups` from the journal; on the worker's loop only."""
        if self.journal is not None:
            for group_id in groups:
                for repeat in range(self.group_size):
                    self.journal.finish(RolloutKey.of_group(group_id, repeat))
