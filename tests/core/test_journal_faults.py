"""The journal's files under faults: a shared folder, foreign files, a full disk, flipped bits, a power-loss tail, an
unusable path (issue 36, items 3, 4, 5, 8 and its decisions)."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.journal_events import model, tool
import gym_bridge.core.journal as journal_module
from gym_bridge.core.journal import JournalError, RunFingerprint, RunJournal, read_frames, rollouts_in_flight
from gym_bridge.core.task import parse_task

REPO = Path(__file__).resolve().parents[2]
TASKS = [parse_task({"prompt": f"q{i}", "environment": "weather"}, index=i) for i in range(3)]
FINGERPRINT = RunFingerprint.of_run(model="m", tasks=TASKS, settings={"limits": {"max_turns": 8}})


def commit(journal: RunJournal, key, at: int, events: list) -> None:
    async def durable() -> None:
        await journal.commit(key, attempt=1, at=at, events=events, budgets={"turns": 1, "seconds": 1.0}, kind="replay")

    asyncio.run(durable())


def killed_run(directory: Path) -> Path:
    """A journal that a killed run left: rollouts (0, 0) with two events and (1, 0) with one; returns its journal file."""
    journal = RunJournal.prepare(directory, FINGERPRINT, resume=False)
    commit(journal, (0, 0), 0, [model([1, 2]), tool("a")])
    commit(journal, (1, 0), 0, [model([3])])
    return journal.path  # killed: never closed (a journal prepared again in this process takes its lock over)


# -- item 3: one process per journal folder ----------------------------------------------------------------------


def test_a_second_process_on_a_journal_folder_is_refused_naming_the_folder_and_the_holder(tmp_path):
    folder = tmp_path / "j"
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from gym_bridge.core.journal import RunFingerprint, RunJournal
            RunJournal.prepare({str(folder)!r}, RunFingerprint(model="m", tasks="t"), resume=True)
            print("ready", flush=True)
            time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == "ready"  # type: ignore[union-attr]
        (live,) = list(folder.glob("*.log"))
        with pytest.raises(JournalError, match=rf"journal folder {folder} is in use by another gym-bridge process \(pid {holder.pid} on "):
            RunJournal.prepare(folder, RunFingerprint(model="m", tasks="t"), resume=True)
        assert live.exists()  # the live process's journal file was neither folded nor removed
    finally:
        holder.kill()
        holder.wait(10)
    again = RunJournal.prepare(folder, RunFingerprint(model="m", tasks="t"), resume=True)  # a killed holder's lock is gone
    assert not live.exists()  # now its file is folded into this one
    asyncio.run(again.close())
    assert not folder.exists()


def test_serve_refuses_a_journal_folder_another_server_holds_with_exit_2(tmp_path, smol_tokenizer, turn):
    from gym_bridge.core.registry import get_environment
    from gym_bridge.core.journal import open_journal
    from gym_bridge.serve.agent_server import AgentServerSettings, journal_fingerprint
    from gym_bridge.serve.model_server import build_app as build_model_app
    from tests.support.http_server import app_in_thread
    from tests.support.scripted_model import ScriptedModel, by_turn

    settings = AgentServerSettings(journal_dir=str(tmp_path / "j"), envs=["weather"])
    first = open_journal(tmp_path / "j", journal_fingerprint(settings, [get_environment("weather")]))  # a live server's journal
    model = ScriptedModel(smol_tokenizer, by_turn(turn("12")))
    with app_in_thread(build_model_app(model, model_name="policy")) as model_url:  # serve asks it which model it serves first
        second = subprocess.run([sys.executable, "-m", "gym_bridge", "serve", "--env", "weather", "--journal", str(tmp_path / "j"),
                                 "--model-base-url", f"{model_url}/v1", "--port", "0"],
                                capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert second.returncode == 2, second.stderr[-2000:]
    assert f"the journal folder {tmp_path / 'j'} is in use by another gym-bridge process (pid {os.getpid()} on" in second.stderr
    assert [path.name for path in (tmp_path / "j").glob("*.log")] == [first.path.name]
    asyncio.run(first.close())
    assert not (tmp_path / "j").exists()  # lock file and journal file removed with the folder


# -- item 4: only the journal's own files are read or removed -----------------------------------------------------


def test_only_files_that_are_journal_files_are_removed_and_no_symlink_is_followed(tmp_path):
    folder, outside = tmp_path / "j", tmp_path / "elsewhere"
    folder.mkdir()
    outside.mkdir()
    (outside / "app.log").write_text("someone's log\n")
    (folder / "notes.log").write_text("not a journal\n")
    (folder / "00000000000000000001-1.log").write_text("named like a journal file, not a journal\n")
    (folder / "00000000000000000002-1.log").symlink_to(outside / "app.log")
    journal = RunJournal.prepare(folder, FINGERPRINT, resume=True)
    asyncio.run(journal.close(complete=True))
    assert sorted(path.name for path in folder.iterdir()) == ["00000000000000000001-1.log", "00000000000000000002-1.log", "notes.log"]
    assert (outside / "app.log").read_text() == "someone's log\n"


def test_a_journal_folder_that_is_a_symlink_is_refused_and_its_target_untouched(tmp_path):
    target = tmp_path / "logs"
    target.mkdir()
    (target / "server.log").write_text("keep me\n")
    (tmp_path / "out.jsonl.journal").symlink_to(target)
    with pytest.raises(JournalError, match=r"out\.jsonl\.journal is a symbolic link"):
        RunJournal.prepare(tmp_path / "out.jsonl.journal", FINGERPRINT, resume=False)
    assert [path.name for path in target.iterdir()] == ["server.log"]


# -- item 8 and the format: a checksummed header ----------------------------------------------------------------


@pytest.mark.parametrize("frame", [0, 1, 2], ids=["header frame", "middle frame", "last frame"])
def test_a_flipped_bit_in_a_frames_length_is_refused_naming_file_and_byte(tmp_path, frame):
    journal_file = killed_run(tmp_path / "j")
    data = bytearray(journal_file.read_bytes())
    starts = [0]
    while len(starts) < 3:  # each frame: 16 header bytes, then the length its bytes 4-8 say
        starts.append(starts[-1] + 16 + int.from_bytes(data[starts[-1] + 4:starts[-1] + 8], "little"))
    data[starts[frame] + 4] ^= 0x01  # the lowest bit of the length
    journal_file.write_bytes(bytes(data))
    with pytest.raises(JournalError, match=rf"{journal_file.name}: the frame header at byte {starts[frame]} fails its checksum"):
        RunJournal.prepare(tmp_path / "j", FINGERPRINT, resume=True)
    assert journal_file.read_bytes() == bytes(data)  # refused before anything was touched


def test_a_journal_of_the_older_format_is_refused_by_name(tmp_path):
    import struct
    import zlib

    body = b'{"k":"header","v":1}'
    (tmp_path / "j").mkdir()
    journal_file = tmp_path / "j" / "00000000000000000001-1.log"
    journal_file.write_bytes(struct.pack("<4sII", b"GBJ1", len(body), zlib.crc32(body)) + body)
    with pytest.raises(JournalError, match=r"was written by an older gym_bridge \(journal format 1; this one reads format 2\)"):
        RunJournal.prepare(tmp_path / "j", FINGERPRINT, resume=True)
    assert journal_file.exists()


def test_a_power_loss_tail_of_zero_bytes_is_dropped_with_a_warning_naming_the_bytes(tmp_path):
    journal_file = killed_run(tmp_path / "j")
    size = journal_file.stat().st_size
    with journal_file.open("ab") as file:
        file.write(b"\0" * 4096)
    with pytest.warns(UserWarning, match=rf"{journal_file.name}: dropping the torn tail of 4096 bytes from byte {size}"):
        again = RunJournal.prepare(tmp_path / "j", FINGERPRINT, resume=True)
    assert again.pending() == [(0, 0), (1, 0)] and again.restore((0, 0)).turns == 1  # type: ignore[union-attr]


def test_zero_bytes_over_the_end_of_the_last_frame_are_a_torn_tail_but_zeros_before_a_frame_are_damage(tmp_path):
    journal_file = killed_run(tmp_path / "j")
    data = journal_file.read_bytes()
    journal_file.write_bytes(data[:-5] + b"\0" * 4096)  # the last frame's blocks were lost: its end and more are zeros
    with pytest.warns(UserWarning, match="torn tail"):
        assert [frame["k"] for frame in read_frames(journal_file)] == ["header", "commit"]
    journal_file.write_bytes(data[:40] + b"\0" * 8 + data[48:])  # zeros inside the first commit, a frame after them
    with pytest.raises(JournalError, match="fails its checksum and is not the last one"):
        list(read_frames(journal_file))


# -- item 5: a full disk -------------------------------------------------------------------------------------------


class FullDisk:
    """`os.write` (Linux): of the writes to journal files, the first `ok` go through, the next `failures` write half
    their bytes (as a filling disk does) and then raise ENOSPC, and later ones go through again."""

    def __init__(self, *, ok: int = 0, failures: int) -> None:
        self.ok, self.failures, self.real = ok, failures, os.write

    def __call__(self, fd: int, data) -> int:
        if not os.readlink(f"/proc/self/fd/{fd}").endswith(".log"):  # a lock file, say
            return self.real(fd, data)
        if self.ok > 0 or self.failures <= 0:
            self.ok -= 1
            return self.real(fd, data)
        self.failures -= 1
        self.real(fd, bytes(data)[:len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_moment_of_full_disk_leaves_no_partial_frame_and_costs_no_commit(tmp_path, monkeypatch):
    journal = RunJournal.prepare(tmp_path / "j", FINGERPRINT, resume=False)
    commit(journal, (0, 0), 0, [model([1])])
    monkeypatch.setattr(journal_module.os, "write", FullDisk(failures=2))
    commit(journal, (0, 0), 1, [model([2])])  # waits out the full disk, then is durable
    commit(journal, (1, 0), 0, [model([3])])
    asyncio.run(journal.close())
    again = RunJournal.prepare(tmp_path / "j", FINGERPRINT, resume=True)  # before the fix: "frame ... is not the last one"
    assert [event.token_ids for event in again.restore((0, 0)).events] == [[1], [2]]  # type: ignore[union-attr]
    assert again.restore((1, 0)) is not None


def test_a_journal_folder_that_stays_full_fails_once_and_keeps_what_was_committed(tmp_path, monkeypatch):
    journal = RunJournal.prepare(tmp_path / "j", FINGERPRINT, resume=False)
    journal.full_disk_wait_s = 0.2
    commit(journal, (0, 0), 0, [model([1])])
    monkeypatch.setattr(journal_module.os, "write", FullDisk(failures=10**6))
    with pytest.raises(JournalError, match=rf"journal folder {tmp_path / 'j'} cannot be written \(No space left on device; tried for 0 s\)"):
        commit(journal, (0, 0), 1, [model([2])])
    with pytest.raises(JournalError, match="cannot be written"):  # later commits fail at once, not one wait each
        commit(journal, (1, 0), 0, [model([3])])
    asyncio.run(journal.close(complete=True))  # a failed journal is kept whatever the caller says
    monkeypatch.undo()
    again = RunJournal.prepare(tmp_path / "j", FINGERPRINT, resume=True)
    assert [event.token_ids for event in again.restore((0, 0)).events] == [[1]]  # type: ignore[union-attr]


def test_eval_stops_once_on_a_full_journal_folder_and_its_resume_continues(tmp_path, monkeypatch, smol_template, smol_tokenizer):
    from gym_bridge.core.engine import Engine, EngineConfig
    from gym_bridge.core.rollout_file import read_records
    from gym_bridge.eval.run import run_eval, select_tasks
    from tests.eval.test_kill_resume import CALLS
    from tests.support.resume_kit import TurnPolicy
    from tests.support.scripted_model import finished_turns

    tasks = select_tasks(env_names=["multi_step"], limit=3)
    script, output = finished_turns(smol_tokenizer, CALLS), tmp_path / "out.jsonl"
    monkeypatch.setattr(RunJournal, "full_disk_wait_s", 0.1)
    # the journal file's header and the first group of commits (turn 1 of every rollout) are written, then the disk is full
    monkeypatch.setattr(journal_module.os, "write", FullDisk(ok=2, failures=10**6))
    with pytest.raises(JournalError, match="cannot be written"):
        asyncio.run(run_eval(Engine(TurnPolicy(smol_template, script), smol_template, EngineConfig()), tasks, output=output, journal=True))
    assert not output.exists() or read_records(output) == []  # no rollout was recorded as an `infra` failure
    monkeypatch.undo()
    policy = TurnPolicy(smol_template, script)
    result = asyncio.run(run_eval(Engine(policy, smol_template, EngineConfig()), tasks, output=output, resume=True))
    records = read_records(result.output)
    assert len(records) == 3 and all(record["failure_kind"] is None for record in records)
    assert all(record["metrics"]["resumed_from_turn"] >= 1 for record in records)  # the committed turns were kept


# -- decisions: an unusable journal path ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["dangling symlink", "regular file", "under a file"])
def test_an_unusable_journal_path_is_refused_naming_it(tmp_path, kind):
    path = tmp_path / "out.jsonl.journal"
    if kind == "dangling symlink":
        path.symlink_to(tmp_path / "gone")
    elif kind == "regular file":
        path.write_text("x")
    else:
        (tmp_path / "file").write_text("x")
        path = tmp_path / "file" / "journal"
    with pytest.raises(JournalError, match=str(path)):
        RunJournal.prepare(path, FINGERPRINT, resume=False)
    assert rollouts_in_flight(tmp_path / "none") == 0


@pytest.mark.parametrize("kind", ["dangling symlink", "regular file"])
def test_eval_refuses_an_unusable_journal_path_with_exit_2_before_loading_a_model(tmp_path, capsys, kind):
    from gym_bridge.cli import main

    journal = tmp_path / "out.jsonl.journal"
    if kind == "dangling symlink":
        journal.symlink_to(tmp_path / "gone")
    else:
        journal.write_text("x")
    assert main(["eval", "--env", "weather", "--journal", "--no-progress", "--output", str(tmp_path / "out.jsonl")]) == 2
    err = capsys.readouterr().err
    assert str(journal) in err and "crashed" not in err and "Traceback" not in err


# -- item 10: a journal with committed turns is output ---------------------------------------------------------------


def test_a_rerun_without_resume_keeps_a_killed_runs_journal_that_holds_no_record_yet(tmp_path, capsys):
    from gym_bridge.cli import main

    journal_file = killed_run(tmp_path / "out.jsonl.journal")  # hours of turns, and no record written yet
    assert main(["eval", "--env", "weather", "--journal", "--no-progress", "--output", str(tmp_path / "out.jsonl")]) == 2
    err = capsys.readouterr().err
    assert f"the journal {tmp_path / 'out.jsonl.journal'} holds the committed turns of 2 rollouts" in err
    assert "--resume" in err and "--overwrite" in err
    assert journal_file.exists() and not (tmp_path / "out.jsonl").exists()


def test_a_flipped_bit_in_the_last_frames_payload_reads_as_a_torn_tail(tmp_path):
    """The documented limit: the last frame's payload is checked by its own checksum only, like a write cut off."""
    journal_file = killed_run(tmp_path / "j")
    data = bytearray(journal_file.read_bytes())
    data[-3] ^= 0x01
    journal_file.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="torn tail"):
        assert [frame["k"] for frame in read_frames(journal_file)] == ["header", "commit"]


def test_a_trl_rank_journal_another_trainer_holds_is_refused(tmp_path, smol_template):
    """The TRL workers open their folders through `RunJournal.prepare` too: a second trainer on `<journal_dir>/rank0`."""
    from gym_bridge.core.engine import Engine, EngineConfig
    from gym_bridge.trl._step_journal import StepJournal
    from tests.support.resume_kit import TurnPolicy

    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import time
            from gym_bridge.core.journal import RunFingerprint, RunJournal
            RunJournal.prepare({str(tmp_path / "rank0")!r}, RunFingerprint(model="", tasks="t"), resume=True)
            print("ready", flush=True)
            time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == "ready"  # type: ignore[union-attr]
        engine = Engine(TurnPolicy(smol_template, []), smol_template, EngineConfig())
        with pytest.raises(JournalError, match=rf"rank0 is in use by another gym-bridge process \(pid {holder.pid} on"):
            StepJournal.open(tmp_path, rank=0, config=engine.config)
        assert engine.journal is None
    finally:
        holder.kill()
        holder.wait(10)


def test_a_journal_folder_on_a_read_only_mount_is_refused_naming_it(tmp_path, monkeypatch):
    folder = tmp_path / "j"
    folder.mkdir()
    real_open = os.open

    def read_only(path, flags, *args):  # what a read-only mount answers to creating a file in the folder
        if flags & os.O_CREAT and str(path).startswith(str(folder)):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(journal_module.os, "open", read_only)
    with pytest.raises(JournalError, match=rf"the journal folder {folder} cannot be used: .*Read-only file system"):
        RunJournal.prepare(folder, FINGERPRINT, resume=True)


def test_eval_refuses_a_damaged_journal_without_resume_and_says_overwrite_discards_it(tmp_path, capsys):
    from gym_bridge.cli import main

    journal_file = killed_run(tmp_path / "out.jsonl.journal")
    data = bytearray(journal_file.read_bytes())
    data[5] ^= 0x01  # the header frame's length
    journal_file.write_bytes(bytes(data))
    assert main(["eval", "--env", "weather", "--no-progress", "--output", str(tmp_path / "out.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "the frame header at byte 0 fails its checksum" in err and "pass --overwrite to start --output" in err
