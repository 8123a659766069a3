"""The journal's storage: frames, group commits, torn and damaged files, another run's journal, removal when done."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.support.journal_events import model, tool
from gym_bridge.core.journal import JournalError, RunFingerprint, RunJournal, encode_frame, read_frames
from gym_bridge.core.task import parse_task

TASKS = [parse_task({"prompt": f"q{i}", "environment": "weather"}, index=i) for i in range(3)]


def fingerprint(**overrides) -> RunFingerprint:
    values = {"model": "m", "tasks": TASKS, "settings": {"sampling": {"temperature": 0.7}, "limits": {"max_turns": 8}}}
    values.update(overrides)
    return RunFingerprint.of_run(**values)


def commit(journal: RunJournal, key, at: int, events: list, seconds: float = 1.0) -> None:
    async def durable() -> None:
        await journal.commit(key, attempt=1, at=at, events=events, budgets={"turns": 1, "tokens": 5, "seconds": seconds}, kind="replay")

    asyncio.run(durable())


def test_committed_turns_come_back_and_finished_rollouts_are_dropped(tmp_path):
    journal = RunJournal.prepare(tmp_path / "j", fingerprint(), resume=False)
    commit(journal, (0, 0), 0, [model([1, 2]), tool("a")])
    commit(journal, (0, 0), 2, [model([3])], seconds=2.5)
    commit(journal, (1, 0), 0, [model([9])])
    commit(journal, (2, 1), 0, [model([7])])
    journal.finish((1, 0))  # its record was written
    asyncio.run(journal.close())  # (2, 1) and (0, 0) are still in flight: the journal stays

    again = RunJournal.prepare(tmp_path / "j", fingerprint(), resume=True, finished={(2, 1)})  # (2, 1) is in the output
    state = again.restore((0, 0))
    assert state is not None and [event.kind for event in state.events] == ["model", "tool", "model"]
    assert state.budgets["seconds"] == 2.5 and state.turns == 2
    assert again.restore((1, 0)) is None and again.restore((2, 1)) is None
    assert len(list((tmp_path / "j").glob("*.log"))) == 1  # the old journal file was folded into the new one
    again.finish((0, 0))
    asyncio.run(again.close())
    assert not (tmp_path / "j").exists()  # nothing left in flight: removed


def test_a_torn_last_frame_is_dropped_and_a_damaged_middle_frame_is_refused(tmp_path):
    path = tmp_path / "seg.log"
    first, second = encode_frame({"k": "header", "n": 1}), encode_frame({"k": "done", "r": [0, 0]})
    path.write_bytes(first + second[:-3])  # killed mid-write of the second frame
    # header 16 + '{"k":"header","n":1}' 20 = 36 bytes; then 16 + '{"k":"done","r":[0,0]}' 22 - 3 = 35 torn bytes
    with pytest.warns(UserWarning, match=r"seg\.log: dropping the torn tail of 35 bytes from byte 36"):
        assert [frame["k"] for frame in read_frames(path)] == ["header"]
    damaged = bytearray(first + second)
    damaged[20] ^= 0xFF  # a byte of the first frame's body (after its 16-byte header)
    path.write_bytes(bytes(damaged))
    with pytest.raises(JournalError, match=r"seg\.log: frame at byte 0 fails its checksum"):
        list(read_frames(path))


def test_a_journal_of_another_run_is_refused_naming_what_differs(tmp_path):
    journal = RunJournal.prepare(tmp_path / "j", fingerprint(), resume=False)
    commit(journal, (0, 0), 0, [model([1])])
    asyncio.run(journal.close())
    other = fingerprint(model="other", settings={"sampling": {"temperature": 0.0}, "limits": {"max_turns": 8}})
    with pytest.raises(JournalError) as error:
        RunJournal.prepare(tmp_path / "j", other, resume=True)
    message = str(error.value)
    assert ".log is the journal of another run" in message
    assert "model (journal: 'm', this run: 'other')" in message and "setting sampling.temperature (journal: 0.7, this run: 0.0)" in message
    assert "limits" not in message
    with pytest.raises(JournalError, match="tasks"):
        RunJournal.prepare(tmp_path / "j", fingerprint(tasks=TASKS[:2]), resume=True)
    assert len(list((tmp_path / "j").glob("*.log"))) == 1  # nothing was touched


def test_without_resume_an_old_journal_is_discarded(tmp_path):
    journal = RunJournal.prepare(tmp_path / "j", fingerprint(), resume=False)
    commit(journal, (0, 0), 0, [model([1])])
    fresh = RunJournal.prepare(tmp_path / "j", fingerprint(model="new"), resume=False)
    assert fresh.restore((0, 0)) is None
    assert [path.name for path in Path(tmp_path / "j").glob("*.log")] == [fresh.path.name]


def test_commits_of_one_moment_share_an_fsync(tmp_path, monkeypatch):
    import gym_bridge.core.journal as journal_module

    syncs: list[int] = []
    real_fsync = journal_module.os.fsync
    monkeypatch.setattr(journal_module.os, "fsync", lambda fd: (syncs.append(fd), real_fsync(fd)))
    journal = RunJournal.prepare(tmp_path / "j", fingerprint(), resume=False)
    syncs.clear()

    async def many() -> None:
        await asyncio.gather(*(journal.commit((i, 0), attempt=1, at=0, events=[model([])], budgets={}, kind="replay")
                               for i in range(50)))

    asyncio.run(many())
    assert 1 <= len(syncs) <= 2  # 50 commits, one group (a second one at most for a commit that came late)
    asyncio.run(journal.close())
    states = RunJournal.prepare(tmp_path / "j", fingerprint(), resume=True)
    assert all(states.restore((i, 0)) is not None for i in range(50))


def test_journal_files_of_several_processes_are_read_in_attempt_order_and_a_done_rollout_is_dropped(tmp_path):
    """Ray workers each write a journal file; a later attempt (in a file whose name sorts first) continues the events of
    an earlier one, whatever the order of the file names."""
    driver = RunJournal.prepare(tmp_path / "j", fingerprint(), resume=False)
    driver.shared = True  # as RayRollouts.with_journal sets it
    late = RunJournal.join(tmp_path / "j", fingerprint())
    early = RunJournal.join(tmp_path / "j", fingerprint())

    async def commits() -> None:
        await early.commit((0, 0), attempt=1, at=0, events=[model([1]), tool("a")],
                           budgets={"seconds": 1.0}, kind="replay")
        await late.commit((0, 0), attempt=2, at=2, events=[model([2])], budgets={"seconds": 2.0}, kind="replay")
        await early.commit((1, 0), attempt=1, at=0, events=[model([9])], budgets={}, kind="replay")

    asyncio.run(commits())
    assert sorted(tmp_path.joinpath("j").glob("*.log"))[1] == late.path  # the later attempt's file sorts first
    driver.finish((1, 0))  # its record was written
    asyncio.run(driver.close())
    reader = RunJournal.join(tmp_path / "j", fingerprint())
    reader.load([(0, 0), (1, 0)])
    state = reader.restore((0, 0))
    assert state is not None and [getattr(event, "token_ids", None) for event in state.events] == [[1], None, [2]]
    assert state.attempt == 2 and state.budgets == {"seconds": 2.0}
    assert reader.restore((1, 0)) is None
    with pytest.raises(JournalError, match="another run"):
        RunJournal.join(tmp_path / "j", fingerprint(model="other")).load([(0, 0)])
