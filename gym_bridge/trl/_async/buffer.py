"""The rows TRL's trainer takes from the async worker (`rollout_buffer`), and what a take tells the worker.

TRL's trainer calls `rollout_buffer.get(...)` on its own thread and knows nothing else of the worker, so a take is the
only moment the worker learns a row was consumed and at which version: `RolloutBuffer.get` hands the row over and
then reports the take (to the checkpoint ledger, the staleness metrics and the records file). Everything it shares
with the worker's loop (the records file, the ledger) is behind its lock or thread-safe itself.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gym_bridge.core.record import RolloutRecord, with_consumed_version
from gym_bridge.core.rollout_file import RolloutWriter
from gym_bridge.trl._async.rows import Row

__all__ = ["RolloutBuffer"]


@dataclass(frozen=True)
class _Queued:
    sample: Any
    record: RolloutRecord | None
    """Written, with the version it was taken at, when this row is taken (a rollout's first row only)."""


class RolloutBuffer:
    """A FIFO of training rows: the worker's loop `push`es a group's rows, the trainer's thread `get`s them one by one
    (the `queue.Queue` methods TRL uses), and each take is reported: `taken`, staleness metrics into `metrics`,
    the rollout's record (with `metrics.consumed_version`) into `records_path`. `taken(group_id)` hears of each take."""

    def __init__(self, *, version: Callable[[], int], taken: Callable[[int], None], metrics: queue.Queue[dict[str, Any]],
                 records_path: str | None) -> None:
        self._version = version
        self._on_taken = taken
        self._metrics = metrics
        self._queue: queue.Queue[_Queued] = queue.Queue()
        self._lock = threading.Lock()
        self._writer = RolloutWriter(records_path, append=True) if records_path else None

    # -- the trainer's side (queue.Queue's interface) -----------------------------------------------

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """The next row (raises `queue.Empty` as `queue.Queue.get` does); the take is reported before it returns."""
        queued = self._queue.get(block, timeout)
        self._taken(queued)
        return queued.sample

    def get_nowait(self) -> Any:
        return self.get(block=False)

    def empty(self) -> bool:
        return self._queue.empty()

    def qsize(self) -> int:
        return self._queue.qsize()

    # -- the worker's side --------------------------------------------------------------------------

    def push(self, rows: Sequence[Row], *, left_out: Sequence[RolloutRecord] = ()) -> None:
        """Queue a group's rows; the records of its rollouts left out of the loss are written now."""
        self._write(record.to_dict() for record in left_out)
        for row in rows:
            row.sample.enqueued_at = time.time()
            self._queue.put_nowait(_Queued(row.sample, row.record if row.first and self._writer is not None else None))

    def close(self) -> None:
        """Close the records file (rows taken afterwards are no longer written)."""
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    def _taken(self, queued: _Queued) -> None:
        version = self._version()
        sample = queued.sample
        staleness = version - int(sample.model_version)
        oldest = staleness + int(sample.metrics.get("gym_bridge/row_version_span", 0))
        self._on_taken(int(sample.group_id))
        self._metrics.put_nowait({"gym_bridge/staleness_max": float(staleness), "gym_bridge/staleness_mean": float(staleness),
                                  "gym_bridge/oldest_token_staleness_max": float(oldest)})
        if queued.record is not None:
            self._write([with_consumed_version(queued.record.to_dict(), version)])

    def _write(self, rows: Any) -> None:
        with self._lock:
            if self._writer is not None:
                for row in rows:
                    self._writer.write(row)
