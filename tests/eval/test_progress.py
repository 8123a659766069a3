"""The run loop tells its observer when rollouts start, of each record and when it stops; the progress bar is one."""

import asyncio
import logging

import pytest

from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.policy import ScriptedPolicy
from gym_bridge.data.task_files import write_rows
from gym_bridge.eval.progress import PROGRESS_LOG_EVERY_S, RunProgress
from gym_bridge.eval.run import run_eval, select_ready_tasks


class Recorder:
    """A RunObserver that writes down what it is told."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.calls: list[tuple] = []
        self.fail_at = fail_at

    def started(self, tasks, *, repeats):  # type: ignore[no-untyped-def]
        self.calls.append(("started", len(tasks), repeats))

    def record_done(self, row: dict) -> None:
        self.calls.append(("record", row["task_index"], row["repeat_index"]))
        if len(self.calls) - 1 == self.fail_at:
            raise KeyboardInterrupt  # Ctrl-C while a record is shown

    def finished(self) -> None:
        self.calls.append(("finished",))


def _run(tmp_path, smol_template, turn, observer, *, repeats: int = 2):  # type: ignore[no-untyped-def]
    rows = [{"prompt": "x", "environment": "tests.support.failing_env:AlwaysRight", "expected_answer": "4"} for _ in range(3)]
    tasks = select_ready_tasks(data_paths=[write_rows(rows, tmp_path / "rows.jsonl")])
    engine = Engine(ScriptedPolicy({"": [turn("4")]}), smol_template, EngineConfig())
    return asyncio.run(run_eval(engine, tasks, output=tmp_path / "out.jsonl", num_repeats=repeats, observer=observer))


def test_the_observer_sees_start_every_record_and_the_end(tmp_path, smol_template, turn):
    recorder = Recorder()
    result = _run(tmp_path, smol_template, turn, recorder)
    assert recorder.calls[0] == ("started", 3, 2) and recorder.calls[-1] == ("finished",)
    assert sorted(recorder.calls[1:-1]) == [("record", task, repeat) for task in range(3) for repeat in range(2)]
    assert result.summary["rollouts"] == 6


def test_the_observer_is_told_the_run_stopped_when_it_is_interrupted(tmp_path, smol_template, turn):
    recorder = Recorder(fail_at=2)
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path, smol_template, turn, recorder)
    assert [call[0] for call in recorder.calls] == ["started", "record", "record", "finished"]


def test_the_progress_bar_counts_rewards_and_failures_and_puts_log_lines_above_it(tmp_path, smol_template, turn, capsys):
    logger = logging.getLogger("gym_bridge")
    propagate = logger.propagate

    class LogOnce(RunProgress):
        def record_done(self, row: dict) -> None:
            super().record_done(row)
            if self.bar.n == 1:
                logger.warning("an alarm")

    progress = LogOnce(concurrency=2, interactive=False)
    _run(tmp_path, smol_template, turn, progress)
    err = capsys.readouterr().err
    assert progress.every_s == PROGRESS_LOG_EVERY_S  # not a terminal: written at most every 30 s, and at the end
    assert "an alarm\n" in err and "rollouts: 0/6" in err  # the alarm on a line of its own
    assert "6/6" in err and "mean_reward=1.000" in err and "failed=0" in err
    assert logger.propagate is propagate and not logger.handlers  # the log handler is gone with the bar
