"""What an eval run shows while it runs: `RunObserver`, the three calls `run_eval` makes to whoever watches
(started, a record done, finished), and `RunProgress`, the progress bar `gym-bridge eval` watches with.

The bar counts rollouts, mean reward and failures, and shows an ETA per environment (`Eta`); on a terminal
it is redrawn every second, into a log file at most every `PROGRESS_LOG_EVERY_S`. While it is shown,
gym_bridge's log lines are printed above it. The run loop knows none of this: it only calls the observer.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

if TYPE_CHECKING:
    from gym_bridge.core.registry import TaskSet

PROGRESS_LOG_EVERY_S = 30.0
"""How often the progress bar is written when stderr is not a terminal (a log file, a pipe): a line a second there
is noise; on a terminal it is redrawn every second."""


class RunObserver(Protocol):
    """Watches an eval run (`run_eval(..., observer=...)`); called on the run's event loop."""

    def started(self, tasks: TaskSet, *, repeats: int) -> None:
        """The run is about to start its rollouts: `repeats` of each of `tasks`."""

    def record_done(self, row: dict[str, Any]) -> None:
        """One rollout record (as written to the output) is done."""

    def finished(self) -> None:
        """The run stopped (done, failed or interrupted); called once after `started`."""


class RunProgress:
    """The progress bar of an eval run: rollouts finished, mean reward, failures and an ETA (`Eta`), per environment
    by its name (never a NeMo Gym alias its rows route by). On a terminal (`interactive`) it is redrawn every second;
    into a log file at most every `PROGRESS_LOG_EVERY_S`, and when the run ends. Log lines go above it."""

    def __init__(self, *, concurrency: int, interactive: bool) -> None:
        self.concurrency = concurrency
        self.every_s = 1.0 if interactive else PROGRESS_LOG_EVERY_S
        self.interactive = interactive
        self.scored, self.reward = 0, 0.0

    def started(self, tasks: TaskSet, *, repeats: int) -> None:
        from tqdm import tqdm

        tasks_per_env = Counter(tasks.env_classes[task.env_name].name for task in tasks.tasks)
        total = len(tasks.tasks) * repeats
        self.eta = Eta(dict(tasks_per_env), repeats=repeats, concurrency=self.concurrency)
        self.first_wave = min(self.concurrency, total)
        self.bar = tqdm(total=total, desc="rollouts", unit="rollout", file=sys.stderr, smoothing=0,
                        mininterval=0.1 if self.interactive else self.every_s, bar_format=progress_format(0, first_wave=self.first_wave))
        self.bar.set_postfix_str("generating the first batch", refresh=False)
        self._ticker = asyncio.ensure_future(_tick(self.redraw, every_s=self.every_s))
        self._quiet_logs = _logs_above(self.bar)

    def _format(self, finished: int) -> str:
        return progress_format(finished, first_wave=self.first_wave, remaining_s=self.eta.remaining_s(now_s=time.monotonic()),
                               unseen=self.eta.unseen())

    def redraw(self) -> None:
        self.bar.bar_format = self._format(int(self.bar.n))
        self.bar.refresh()

    def record_done(self, row: dict[str, Any]) -> None:
        """One record written. No redraw here: `update` redraws at most every `mininterval`, not once per record."""
        if not row["mask_sample"]:
            self.scored += 1
            self.reward += row["reward"]
        self.eta.add(str(row.get("env")), float((row.get("metrics") or {}).get("latency_s") or 0.0), at_s=time.monotonic())
        self.bar.set_postfix(mean_reward=f"{self.reward / self.scored:.3f}" if self.scored else "n/a",
                             failed=self.bar.n + 1 - self.scored, refresh=False)
        self.bar.bar_format = self._format(int(self.bar.n) + 1)
        self.bar.update(1)

    def finished(self) -> None:
        self._ticker.cancel()
        self._quiet_logs()
        self.bar.close()


def progress_format(finished: int, *, first_wave: int, remaining_s: float | None = None, unseen: Sequence[str] = ()) -> str:
    """The progress bar's layout: no ETA until the first wave of rollouts (as many as run at once) has
    finished. Rollouts start together and finish together, so the rate of the first few to finish says
    nothing about the rest (it showed an hour for a run that took minutes). After it, the ETA is
    `remaining_s` (see `Eta`), none while environments in `unseen` have no finished rollout, or tqdm's
    average rate when neither is given."""
    if finished < first_wave:
        return "{desc}: {n_fmt}/{total_fmt} [{elapsed} elapsed, ETA after the first " + str(first_wave) + " rollouts{postfix}]"
    if unseen:
        return "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed} elapsed, ETA after a first rollout of " + ", ".join(unseen) + "{postfix}]"
    if remaining_s is None:
        return "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
    from tqdm import tqdm

    return "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<" + tqdm.format_interval(remaining_s) + ", {rate_fmt}{postfix}]"


class Eta:
    """Time left in a run of several environments whose rollouts take very different times.

    tqdm's estimate (rollouts left over the average rate) was off about 5x when fast and slow environments
    mixed. Here each environment's rollouts left count at that environment's mean latency so far (the mean
    of all finished rollouts for one with none finished yet; latencies are measured under the run's load),
    and that work is divided over the rollouts in flight at once: `concurrency`, or all that are left."""

    def __init__(self, tasks_per_env: dict[str, int], *, repeats: int = 1, concurrency: int = 1) -> None:
        self.planned = {env: count * repeats for env, count in tasks_per_env.items()}
        self.concurrency = max(1, concurrency)
        self.done: Counter[str] = Counter()
        self.latency_s: dict[str, float] = defaultdict(float)
        self.last_s = 0.0

    def add(self, env: str, latency_s: float, *, at_s: float) -> None:
        """One rollout of `env` finished after `latency_s`, at `at_s` (a monotonic clock)."""
        self.done[env] += 1
        self.latency_s[env] += latency_s
        self.last_s = at_s

    def unseen(self) -> list[str]:
        """Environments with rollouts planned but none finished: their cost is unknown, so there is no ETA yet."""
        return [env for env, planned in self.planned.items() if planned and not self.done[env]]

    def remaining_s(self, *, now_s: float) -> float | None:
        """Seconds left at `now_s` (counting down from the last finished rollout); None while `unseen()` is not empty."""
        finished, work_s = sum(self.done.values()), sum(self.latency_s.values())
        if not finished or self.unseen():
            return None
        mean_s = work_s / finished
        left = {env: max(0, planned - self.done[env]) for env, planned in self.planned.items()}
        left_s = sum(count * (self.latency_s[env] / self.done[env] if self.done[env] else mean_s) for env, count in left.items())
        return max(0.0, left_s / max(1, min(self.concurrency, sum(left.values()))) - (now_s - self.last_s))


class _AboveTheBar(logging.Handler):
    """Writes gym_bridge's log lines (a tool-call alarm, say) on lines of their own above the progress bar."""

    def __init__(self, bar: Any) -> None:
        super().__init__(logging.WARNING)
        self.bar = bar
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.bar.write(self.format(record), file=sys.stderr)


def _logs_above(bar: Any) -> Callable[[], None]:
    """Print gym_bridge's log lines above `bar`, not glued to it; returns the function that undoes this."""
    logger = logging.getLogger("gym_bridge")
    handler = _AboveTheBar(bar)
    logger.addHandler(handler)
    propagate, logger.propagate = logger.propagate, False

    def undo() -> None:
        logger.removeHandler(handler)
        logger.propagate = propagate

    return undo


async def _tick(redraw: Callable[[], None], every_s: float = 1.0) -> None:
    """Redraw the bar every `every_s`, so its clock moves while the first batch is still generating."""
    while True:
        await asyncio.sleep(every_s)
        redraw()
