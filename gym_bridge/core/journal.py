"""The durable per-turn journal of a run's rollouts in flight, so a killed run continues each episode from its last finished turn.

An append-only log of frames whose header (length) and payload are each checksummed, not a temp file renamed per
rollout: the commits of all rollouts in flight share one fsync (group commit), and a rollout waits for its commit's
fsync before its next model call. A torn tail (a write never acknowledged) is dropped with a warning, a failed write is
cut back to the last whole frame, anything else damaged, another run's journal or a folder in use is refused by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import os
import re
import struct
import time
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Collection, Iterable, Iterator, Literal, Mapping, NamedTuple, Sequence

import orjson

from gym_bridge.core import lock_file
from gym_bridge.core.errors import UserError
from gym_bridge.core.journal_event import ChatEvent, JournalEvent, ModelEvent, event_from_frame
from gym_bridge.core.task import Task

ResumeKind = Literal["snapshot", "replay", "restart"]
"""How an environment's session comes back after a crash: `snapshot` (its `restore` hook), `replay` (the logged tool
calls are run again in a fresh session and each output checked), `restart` (from turn 0)."""


class RolloutKey(NamedTuple):
    """Which rollout a journal's commits belong to: its group of rollouts and its place in that group. One journal holds
    one kind of key, fixed by the entry point that opens it; build a key with the constructor that names that kind
    (`of_task`: eval and serve, `of_step`: TRL's synchronous rollout function, `of_group`: TRL's async worker). Frames
    hold a key as the list `[group, member]`."""

    group: int
    """The task index (eval; serve: NeMo Gym's `_ng_task_index`), the trainer step (TRL sync) or the group id (TRL async)."""
    member: int
    """The repeat index (eval, TRL async; serve: `_ng_rollout_index`) or the position in the step's batch (TRL sync)."""

    @classmethod
    def of_task(cls, task_index: int, repeat_index: int) -> RolloutKey:
        """Repeat `repeat_index` of the task at `task_index` of its dataset."""
        return cls(task_index, repeat_index)

    @classmethod
    def of_step(cls, step: int, position: int) -> RolloutKey:
        """The rollout at `position` of the batch a trainer generates at step `step`."""
        return cls(step, position)

    @classmethod
    def of_group(cls, group_id: int, repeat: int) -> RolloutKey:
        """Repeat `repeat` of the group `group_id` an async worker runs."""
        return cls(group_id, repeat)

JOURNAL_VERSION = 2
"""The frame format and the frames' fields; version 1 had no checksum over a frame's length."""
_MAGIC = b"GBJ2"
_OLD_MAGICS = {b"GBJ1": 1}
"""The magic of each older format, and its version."""
_PREFIX = struct.Struct("<4sII")
"""Magic, payload length, CRC-32 of the payload; followed by the CRC-32 of these 12 bytes (`_CHECK`), then the payload."""
_CHECK = struct.Struct("<I")
_HEADER_SIZE = _PREFIX.size + _CHECK.size
_FILE_NAME = re.compile(r"\d{20}-\d+\.log")
"""How `RunJournal` names a journal file: nanoseconds since the epoch, then the pid of the process writing it."""
LOCK_NAME = "lock"
"""The lock file in a journal folder (`gym_bridge.core.lock_file`): one process prepares a folder at a time."""
FULL_DISK_WAIT_S = 10.0
"""How long a journal write that keeps failing (a full disk) is tried again before the journal fails for good."""


class JournalError(UserError):
    """A journal that cannot be used: damaged, from another run, or of an unknown version; the message names the file."""


@dataclass(frozen=True)
class RunFingerprint:
    """What a journal's rollouts depend on: the model, the tasks and the settings that shape a rollout."""

    model: str
    tasks: str
    """`N tasks, sha256 <prefix>` over the task rows and their indices."""
    settings: Mapping[str, Any] = field(default_factory=dict)
    """Flat `section.key -> value` (sampling, limits, deadline, parsers)."""

    @classmethod
    def of_run(cls, *, model: str, tasks: Sequence[Task], settings: Mapping[str, Any]) -> RunFingerprint:
        digest = hashlib.sha256()
        for task in tasks:
            digest.update(orjson.dumps([task.index, task.row], option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS))
        return cls(model=model, tasks=f"{len(tasks)} tasks, sha256 {digest.hexdigest()[:16]}", settings=_flat(settings))

    @classmethod
    def of_engine(cls, config: Any, tasks: Sequence[Task], *, repeats: int | None = None,
                  env_classes: Iterable[type[Any]] = (), model: str | None = None) -> RunFingerprint:
        """The fingerprint of a run of `config` (an `EngineConfig`) over `tasks`: every setting but the concurrency
        bounds, which do not change a rollout (a run may resume with another `--concurrency`), plus `repeats` (rollouts
        per task: a resume with fewer would leave groups uneven) and the settings of `env_classes` (`environment_settings`).
        `model`: what generates, where the caller knows it better than `config.model_name` (a served model's identity)."""
        settings = {key: value for key, value in dataclasses.asdict(config).items()
                    if key not in ("max_concurrency", "per_env_concurrency", "model_name")}
        if repeats is not None:
            settings["num_repeats"] = repeats
        settings.update(environment_settings(env_classes))
        return cls.of_run(model=config.model_name if model is None else model, tasks=tasks, settings=settings)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "tasks": self.tasks, "settings": dict(self.settings)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunFingerprint:
        return cls(model=str(data.get("model")), tasks=str(data.get("tasks")), settings=dict(data.get("settings") or {}))

    def differences(self, other: RunFingerprint) -> list[str]:
        """What differs between this (the journal's) and `other` (this run's), one phrase each."""
        found = [f"{name} (journal: {mine!r}, this run: {theirs!r})"
                 for name, mine, theirs in (("model", self.model, other.model), ("tasks", self.tasks, other.tasks)) if mine != theirs]
        for key in sorted(set(self.settings) | set(other.settings)):
            mine, theirs = self.settings.get(key), other.settings.get(key)
            if _canonical(mine) != _canonical(theirs):
                found.append(f"setting {key} (journal: {mine!r}, this run: {theirs!r})")
        return found


def environment_settings(env_classes: Iterable[type[Any]]) -> dict[str, Any]:
    """`env.<name>.<key> -> value` of what `--env-setting` may change on each environment class (its `settings` and
    timeouts): a `snapshot` environment restored under other settings would go on in a session they did not make. A
    value that is not JSON data stands as its type's name (an object's repr would differ from run to run)."""
    found: dict[str, Any] = {}
    for env_class in sorted(set(env_classes), key=lambda env_class: str(env_class.name)):
        for key in (*env_class.settings, "tool_timeout_s", "verify_timeout_s"):
            found[f"env.{env_class.name}.{key}"] = _json_or_type(getattr(env_class, key, None))
    return found


def _json_or_type(value: Any) -> Any:
    try:
        _canonical(value)
    except TypeError:
        return f"<{type(value).__qualname__}>"
    return value


def _canonical(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)


def _flat(settings: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` as `{"a.b": 1}`, with tuples as lists (as JSON reads them back)."""
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, Mapping) and value:
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = orjson.loads(_canonical(value))
    return flat


@dataclass
class RolloutState:
    """What the journal holds for one rollout in flight: its committed events and budgets."""

    key: RolloutKey
    attempt: int
    """Attempts started so far (1 for a rollout that ran once and was cut off)."""
    events: list[JournalEvent]
    """In order: model calls (`ModelEvent`, `ChatEvent`), tool calls and their outputs, user messages."""
    budgets: dict[str, Any]
    """At the last commit: `turns` (model calls), `tokens` (after the prompt), `seconds` (over all attempts)."""
    kind: str
    snapshot: Any = None
    snapshot_version: int | None = None

    @property
    def turns(self) -> int:
        return sum(1 for event in self.events if isinstance(event, (ModelEvent, ChatEvent)))

    def to_frame(self) -> dict[str, Any]:
        return {"k": "commit", "r": list(self.key), "a": self.attempt, "at": 0, "ev": [event.to_frame() for event in self.events], "b": self.budgets,
                "kind": self.kind, "snap": self.snapshot, "sv": self.snapshot_version}


def encode_frame(payload: Mapping[str, Any]) -> bytes:
    """One frame: magic, payload length, CRC-32 of the payload, CRC-32 of those 12 bytes, then the payload as JSON."""
    try:
        body = orjson.dumps(payload)  # the common frame: string keys, plain values (a quarter faster than with options)
    except TypeError:
        body = orjson.dumps(payload, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)
    prefix = _PREFIX.pack(_MAGIC, len(body), zlib.crc32(body))
    return prefix + _CHECK.pack(zlib.crc32(prefix)) + body


def read_frames(path: Path) -> Iterator[dict[str, Any]]:
    """The frames of one journal file. A torn tail (what a write cut off by a kill or a power loss left after the last whole
    frame: part of a frame, or zero bytes) is dropped with a warning naming its bytes; raises JournalError naming the
    file and byte for any other damage, bytes that are not a journal, or a journal of an older format."""
    data = path.read_bytes()
    offset = 0
    while offset < len(data):
        end = _frame_end(data, offset, path)
        if end is None:
            warnings.warn(f"{path}: dropping the torn tail of {len(data) - offset} bytes from byte {offset} (a write cut off "
                          "by a kill or a power loss, never acknowledged: no rollout went on past it)", stacklevel=2)
            return
        try:
            frame = orjson.loads(data[offset + _HEADER_SIZE:end])
        except orjson.JSONDecodeError as error:
            raise JournalError(f"{path}: frame at byte {offset} passes its checksum but is not JSON ({error})") from None
        yield frame
        offset = end


def _frame_end(data: bytes, offset: int, path: Path) -> int | None:
    """Where the frame at `offset` ends; None when it starts a torn tail: it runs past the end of the file, or is the
    last frame and fails its payload checksum, or the file holds only zero bytes from within it on (a power loss that
    kept the file's length but not its last blocks). Raises JournalError for damage anywhere else."""
    if len(data) - offset < _HEADER_SIZE:
        return None
    magic, length, body_crc = _PREFIX.unpack_from(data, offset)
    (header_crc,) = _CHECK.unpack_from(data, offset + _PREFIX.size)
    if magic in _OLD_MAGICS and offset == 0:
        raise JournalError(f"{path} was written by an older gym_bridge (journal format {_OLD_MAGICS[magic]}; this one "
                           f"reads format {JOURNAL_VERSION}): finish the run with that version, or remove the journal "
                           "folder to restart its rollouts from turn 0")
    if magic != _MAGIC or zlib.crc32(data[offset:offset + _PREFIX.size]) != header_crc:
        if _zero_from(data) <= offset + _HEADER_SIZE:
            return None
        raise JournalError(f"{path}: the frame header at byte {offset} fails its checksum (the file is damaged, or not a "
                           "gym_bridge journal); remove it to restart its rollouts from turn 0")
    end = offset + _HEADER_SIZE + int(length)
    if end > len(data):
        return None
    if zlib.crc32(data[offset + _HEADER_SIZE:end]) != body_crc:
        if _zero_from(data) <= end:
            return None
        raise JournalError(f"{path}: frame at byte {offset} fails its checksum and is not the last one (the file is "
                           "damaged); remove it to restart its rollouts from turn 0")
    return end


def _zero_from(data: bytes) -> int:
    """Where the run of zero bytes that ends `data` starts (`len(data)` when it ends in another byte)."""
    return len(data.rstrip(b"\0"))


def journal_files(directory: Path) -> list[Path]:
    """The journal files in `directory`, oldest first: regular files (never a symbolic link) named as `RunJournal`
    names them whose first bytes are a journal frame's magic (or a part of it: a file cut off as it was created).
    Nothing else in the folder is read or removed."""
    found = []
    for path in sorted(directory.iterdir()):
        if _FILE_NAME.fullmatch(path.name) and not path.is_symlink() and path.is_file():
            with path.open("rb") as file:
                head = file.read(len(_MAGIC))
            if any(magic.startswith(head) for magic in (_MAGIC, *_OLD_MAGICS)):
                found.append(path)
    return found


def journal_dir_for(output: str | Path) -> Path:
    """Where `gym-bridge eval --output FILE` keeps its journal: `FILE.journal/`."""
    output = Path(output)
    return output.with_name(output.name + ".journal")


def check_folder(directory: Path) -> None:
    """Raises JournalError naming `directory` when it cannot be a journal folder: a symbolic link (a journal never
    follows one out, nor removes what it points to) or something other than a folder."""
    if directory.is_symlink():
        raise JournalError(f"the journal folder {directory} is a symbolic link: give a path to a real folder (or to none: "
                           "it is made), so that removing the journal never reaches another folder's files")
    if directory.exists() and not directory.is_dir():
        raise JournalError(f"the journal folder {directory} is not a folder: remove it, or give another path")


def rollouts_in_flight(directory: Path) -> int:
    """How many rollouts the journal in `directory` holds committed turns of with no finished record (0 when there is
    no journal), whatever run wrote it. Raises JournalError for a damaged journal or an unusable folder."""
    check_folder(directory)
    if not directory.exists():
        return 0
    try:
        return len(RunJournal(directory, RunFingerprint(model="", tasks=""))._read(journal_files(directory), check=False))
    except OSError as error:
        raise JournalError(f"the journal folder {directory} cannot be read: {error}") from None


_locked_folders: dict[str, RunJournal] = {}
"""The journal of this process holding each folder's lock; a journal prepared again over a folder in the same process
(a test standing for a restarted process, whose dropped journal was never closed) takes the lock over."""


class RunJournal:
    """The journal of one run: `prepare` it (reading what an earlier, killed run left), `restore` each rollout's
    committed state, `commit` at turn boundaries, `finish` a rollout once its record is written, `close` at the end.

    One process writes one journal file; `prepare` folds the files it found into its own (one frame per rollout still
    in flight) before removing them, so a crash at any moment leaves a readable journal. `prepare` holds the folder's
    lock until `close`: a second process preparing it is refused, naming the holder.
    """

    full_disk_wait_s = FULL_DISK_WAIT_S

    def __init__(self, directory: Path, fingerprint: RunFingerprint, *, fsync: bool = True) -> None:
        self.directory = directory
        self.fingerprint = fingerprint
        self.fsync = fsync
        self.path = directory / f"{time.time_ns():020d}-{os.getpid()}.log"
        """This process's journal file in `directory`."""
        self._fd: int | None = None
        self._end = 0
        """The file's length up to its last durable frame: where a failed write is cut back to."""
        self._lock: tuple[str, int | None] | None = None
        """The folder's key in `_locked_folders` and the lock's descriptor, while this journal holds it."""
        self.failure: JournalError | None = None
        """Set once writing failed for good (a full disk past `full_disk_wait_s`): every later commit raises it."""
        self._states: dict[RolloutKey, RolloutState] = {}
        self._live: set[RolloutKey] = set()
        """Rollouts with committed frames in this file and no `finish` yet."""
        self._frames: list[bytes] = []
        """Encoded frames not written yet (joined once per group: appending to one growing buffer copied it again and
        again as it grew)."""
        self._waiters: list[asyncio.Future[None]] = []
        """The commits buffered now, woken together once their group is durable."""
        self._flusher: asyncio.Task[None] | None = None
        self.commits = 0
        self.shared = False
        """Other processes commit to this directory (Ray workers): `finish` marks every rollout done, not only this
        process's own."""

    @classmethod
    def prepare(cls, directory: str | Path, fingerprint: RunFingerprint, *, resume: bool,
                finished: set[RolloutKey] | frozenset[RolloutKey] = frozenset(), fsync: bool = True) -> RunJournal:
        """Open the journal in `directory` for a run. With `resume`, the rollouts an earlier run left in flight (not in
        `finished`) are read and carried into this run's journal file; without it, an old journal is discarded.

        Raises JournalError (naming the folder or the file) for a folder in use by another process, one that cannot be a
        journal folder or written, a damaged journal, or one of another run (naming what differs).
        """
        journal = cls(Path(directory), fingerprint, fsync=fsync)
        check_folder(journal.directory)
        try:
            journal.directory.mkdir(parents=True, exist_ok=True)
            journal._take_lock()
            old = journal_files(journal.directory)
            if resume:
                journal._states = {key: state for key, state in journal._read(old).items() if key not in finished}
            journal._start_file([encode_frame(state.to_frame()) for state in journal._states.values()])
        except BaseException as error:
            journal._abandon()
            if isinstance(error, OSError):
                raise JournalError(f"the journal folder {journal.directory} cannot be used: {error}") from None
            raise
        journal._live = set(journal._states)
        for path in old:  # folded into the new file, which is durable: an old one left behind is read again harmlessly
            with contextlib.suppress(OSError):
                path.unlink()
        return journal

    @classmethod
    def join(cls, directory: str | Path, fingerprint: RunFingerprint, *, fsync: bool = True) -> RunJournal:
        """Open a journal file of its own in `directory`, a journal folder a driver prepared (a Ray worker's): nothing is read
        or removed here, and the driver holds the folder's lock; `load` reads the committed state of the rollouts this
        process is sent again.

        Raises JournalError when `directory` is not there (a node that does not share the driver's file system)."""
        journal = cls(Path(directory), fingerprint, fsync=fsync)
        if not journal.directory.is_dir():
            raise JournalError(f"the journal directory {journal.directory} does not exist on this node: the workers must "
                               "see the driver's --output directory (a shared file system at the same path)")
        try:
            journal._start_file([])
        except OSError as error:
            journal._abandon()
            raise JournalError(f"the journal folder {journal.directory} cannot be used: {error}") from None
        return journal

    def _take_lock(self) -> None:
        key = str(self.directory.resolve())
        holder = _locked_folders.get(key)
        if holder is not None and holder._lock is not None:
            self._lock, holder._lock = holder._lock, None
        else:
            self._lock = key, lock_file.acquire(self.directory / LOCK_NAME, lambda who: JournalError(
                f"the journal folder {self.directory} is in use by another gym-bridge process (pid {who}), which would "
                "lose its commits to this one: stop it, or give this process a journal folder of its own"))
        _locked_folders[key] = self

    def _release_lock(self) -> None:
        if self._lock is None:
            return
        key, fd = self._lock
        self._lock = None
        if _locked_folders.get(key) is self:
            del _locked_folders[key]
        lock_file.release(fd, self.directory / LOCK_NAME)

    def _start_file(self, frames: list[bytes]) -> None:
        """Create this process's journal file with its header frame and `frames`, durable (the folder's entry too)."""
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_EXCL, 0o644)
        header = encode_frame({"k": "header", "v": JOURNAL_VERSION, "fingerprint": self.fingerprint.to_dict()})
        data = b"".join([header, *frames])
        self._append(data)
        if self.fsync:
            os.fsync(self._fd)
        self._end = len(data)
        _fsync_dir(self.directory)

    def _abandon(self) -> None:
        """Undo a `prepare` or `join` that failed part way: its file (which holds nothing yet) and lock go."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self.path.unlink(missing_ok=True)
        self._release_lock()

    def load(self, keys: Sequence[RolloutKey]) -> None:
        """Read what every journal file of the directory holds for `keys` (rollouts sent again after their process died), for
        `restore`. Raises JournalError for a damaged file or one of another run."""
        wanted = set(keys)
        found = self._read(journal_files(self.directory))
        self._states.update({key: state for key, state in found.items() if key in wanted})

    def pending(self) -> list[RolloutKey]:
        """The rollouts `prepare` found in flight that no process has restored yet, in order."""
        return sorted(self._states)

    def has_state(self, key: RolloutKey) -> bool:
        """Whether `prepare` found committed turns of rollout `key` that no process has restored yet."""
        return key in self._states

    def _read(self, paths: Sequence[Path], *, check: bool = True) -> dict[RolloutKey, RolloutState]:
        """The rollouts in flight over the journal files `paths` (with `check`, of this run only). One attempt of a rollout runs in
        one process (one file), and a later attempt continues the events of the earlier ones: a rollout's commits
        are applied in attempt order."""
        commits: dict[RolloutKey, list[tuple[int, int, int, dict[str, Any], Path]]] = {}
        done: set[RolloutKey] = set()
        for number, path in enumerate(paths):
            frames = read_frames(path)
            header = next(frames, None)
            if header is None:
                continue  # killed before its header was written: holds nothing
            if check:
                self._check_header(path, header)
            for position, frame in enumerate(frames):
                kind, key = _frame_key(frame, path)
                if kind == "done":
                    done.add(key)
                elif kind == "commit":
                    commits.setdefault(key, []).append((int(frame["a"]), number, position, frame, path))
                else:
                    raise JournalError(f"{path}: unknown frame kind {kind!r}")
        states: dict[RolloutKey, RolloutState] = {}
        for key, frames_of_key in commits.items():
            if key in done:
                continue
            for _, _, _, frame, path in sorted(frames_of_key, key=lambda item: item[:3]):
                _apply(states, key, frame, path)
        return states

    def _check_header(self, path: Path, header: Mapping[str, Any]) -> None:
        if header.get("k") != "header" or header.get("v") != JOURNAL_VERSION:
            raise JournalError(f"{path}: journal version {header.get('v')!r}, this gym_bridge reads version {JOURNAL_VERSION}; "
                               "remove the directory to restart its rollouts from turn 0")
        differences = RunFingerprint.from_dict(header.get("fingerprint") or {}).differences(self.fingerprint)
        if differences:
            raise JournalError(f"{path} is the journal of another run: {'; '.join(differences)}. Resume with the same "
                               f"arguments, or remove {self.directory} to restart the rollouts in flight from turn 0")

    def restore(self, key: RolloutKey) -> RolloutState | None:
        """The committed state of rollout `key` that an earlier run left, once (None when there is none)."""
        return self._states.pop(key, None)

    def commit(self, key: RolloutKey, *, attempt: int, at: int, events: Sequence[JournalEvent], budgets: dict[str, Any],
               kind: str, snapshot: Any = None, snapshot_version: int | None = None) -> Awaitable[None]:
        """Append rollout `key`'s events after its first `at` committed ones, with its budgets (and its environment's
        snapshot). Returns what to await: done once they are durable, fsynced with the other commits of this moment.
        Raises (or the awaitable does) `failure` once the journal cannot be written."""
        if self.failure is not None:
            raise self.failure
        frame = {"k": "commit", "r": list(key), "a": attempt, "at": at, "ev": [event.to_frame() for event in events],
                 "b": budgets, "kind": kind}
        if snapshot is not None or snapshot_version is not None:  # absent reads back as None
            frame["snap"], frame["sv"] = snapshot, snapshot_version
        self._frames.append(encode_frame(frame))
        self._live.add(key)
        self.commits += 1
        waiter = asyncio.get_running_loop().create_future()  # one each: a cancelled rollout cancels only its own
        self._waiters.append(waiter)
        self._schedule()
        return waiter

    def finish(self, key: RolloutKey) -> None:
        """Rollout `key`'s record is written: drop its journal (a `done` frame, made durable with the next commits)."""
        self._states.pop(key, None)
        if key in self._live or self.shared:
            self._live.discard(key)
            self._frames.append(encode_frame({"k": "done", "r": list(key)}))
            self._schedule()

    @property
    def in_flight(self) -> int:
        """Rollouts whose journal holds committed turns and no finished record."""
        return len(self._live)

    async def close(self, *, complete: bool = False) -> None:
        """Write what is pending; remove the journal when no rollout is left in flight (else keep it for `--resume`).
        `complete`: every rollout of the run has its record, so the files of other processes (Ray workers) go too.
        A journal that failed (`failure`) or fails now is kept as it is, cut back to its last whole frame."""
        if self._flusher is not None:
            await asyncio.shield(self._flusher)
        if self._frames and self.failure is None:
            data, self._frames = b"".join(self._frames), []
            self._write_now(data)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        remove = self.failure is None and (complete or (not self.in_flight and not self.shared))  # shared: its `done` frames speak for others' commits
        if remove:
            for path in journal_files(self.directory) if complete else [self.path]:
                path.unlink(missing_ok=True)
        self._release_lock()
        if remove:
            try:
                self.directory.rmdir()
            except OSError:
                pass  # something else lives there (another process's file of a run cut off, a file not the journal's)

    def _schedule(self) -> None:
        if self._flusher is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # `finish` called outside an event loop: write at once
            data, self._frames = b"".join(self._frames), []
            self._write_now(data)
            return
        self._flusher = loop.create_task(self._flush())

    async def _flush(self) -> None:
        """Write and fsync what commits have buffered, then wake them; commits arriving meanwhile form the next group."""
        try:
            while self._frames:
                data, waiters = b"".join(self._frames), self._waiters
                self._frames, self._waiters = [], []
                failure = await self._write_durably(data)
                for waiter in waiters:
                    if waiter.done():
                        continue
                    if failure is None:
                        waiter.set_result(None)
                    else:
                        waiter.set_exception(failure)
        finally:
            self._flusher = None

    async def _write_durably(self, data: bytes) -> JournalError | None:
        """Append `data` and fsync it. A write or fsync that fails (a full disk) is cut back to the last whole frame and
        tried again while it keeps failing for less than `full_disk_wait_s`: a moment of full disk costs a pause, not
        a rollout. Returns the journal's `failure` once it has failed for good (None when `data` is durable)."""
        waited_s, pause_s = 0.0, 0.05
        while self.failure is None:
            try:
                self._append(data)
                if self.fsync and self._fd is not None:
                    await asyncio.to_thread(os.fsync, self._fd)
                self._end += len(data)
                return None
            except OSError as error:
                self._cut_back()
                if waited_s >= self.full_disk_wait_s:
                    self._fail(error, waited_s)
                    break
            await asyncio.sleep(pause_s)
            waited_s, pause_s = waited_s + pause_s, min(2 * pause_s, 1.0)
        return self.failure

    def _write_now(self, data: bytes) -> None:
        """Append `data` durably from outside the event loop's group commits; a failure fails the journal at once."""
        try:
            self._append(data)
            if self.fsync and self._fd is not None:
                os.fsync(self._fd)
            self._end += len(data)
        except OSError as error:
            self._cut_back()
            self._fail(error, 0.0)

    def _append(self, data: bytes) -> None:
        """Write all of `data` at the end of the file (the caller moves `_end` past it once it is durable)."""
        if self._fd is None:
            raise JournalError(f"{self.path}: the journal is closed")
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]

    def _cut_back(self) -> None:
        """Cut the file back to its last whole frame after a failed write (a partial frame must not stay in the
        middle of the file: the frames after it would be refused on `--resume`)."""
        if self._fd is None:
            return
        try:
            if os.fstat(self._fd).st_size > self._end:
                os.ftruncate(self._fd, self._end)
        except OSError as error:
            self._fail(error, 0.0)

    def _fail(self, error: OSError, waited_s: float) -> None:
        if self.failure is None:
            self.failure = JournalError(
                f"the journal folder {self.directory} cannot be written ({error.strerror or error}; tried for {waited_s:.0f} s): "
                f"no more turns are committed, those committed are kept in {self.path.name}. Free space there, then "
                "resume (gym-bridge eval: rerun with --resume)")


def _frame_key(frame: Mapping[str, Any], path: Path) -> tuple[Any, RolloutKey]:
    kind, key_list = frame.get("k"), frame.get("r")
    if not (isinstance(key_list, list) and len(key_list) == 2):
        raise JournalError(f"{path}: a {kind!r} frame names no rollout")
    return kind, RolloutKey(int(key_list[0]), int(key_list[1]))


def _apply(states: dict[RolloutKey, RolloutState], key: RolloutKey, frame: Mapping[str, Any], path: Path) -> None:
    """Fold one commit frame of rollout `key` into the states read so far."""
    at = int(frame["at"])
    state = states.get(key)
    if state is None or at == 0:
        if at != 0:
            raise JournalError(f"{path}: rollout {key} continues at event {at}, but its earlier events are missing")
        state = states[key] = RolloutState(key=key, attempt=int(frame["a"]), events=[], budgets={}, kind=str(frame["kind"]))
    elif at > len(state.events):
        raise JournalError(f"{path}: rollout {key} continues at event {at}, but only {len(state.events)} are committed")
    try:
        state.events[at:] = [event_from_frame(event) for event in frame["ev"]]
    except (KeyError, TypeError, ValueError) as error:
        raise JournalError(f"{path}: rollout {key} holds an event that cannot be read ({error!r})") from None
    state.attempt, state.budgets, state.kind = int(frame["a"]), dict(frame["b"]), str(frame["kind"])
    if frame.get("snap") is not None:  # none: the state did not change since the rollout's last commit
        state.snapshot = frame["snap"]
    state.snapshot_version = frame.get("sv")


def _fsync_dir(directory: Path) -> None:
    """Make a new file's directory entry durable (POSIX: an fsync of the directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


JournalMode = Literal["resume", "fresh", "join"]
"""How `open_journal` opens a journal folder: `resume` (carry on what a killed run left in flight), `fresh` (discard
it), `join` (a journal file of this process's own in a folder a driver prepared: a Ray worker)."""


def open_journal(directory: str | Path, fingerprint: RunFingerprint, *, mode: JournalMode = "resume",
                 finished: Collection[RolloutKey] = frozenset(), shared: bool = False) -> RunJournal:
    """The journal of a run in `directory`, for an `Engine(..., journal=...)`: what every entry point (eval, serve, the Ray
    driver and workers, TRL's rollout function and async worker) opens its journal with. `fingerprint`: what the run's
    rollouts depend on (`RunFingerprint.of_engine`, with the model's identity where the entry point knows it).

    `resume` and `fresh` prepare the folder (`RunJournal.prepare`: this process holds its lock until `close`); with
    `resume`, the rollouts a killed run left in flight, less `finished`, are carried on. `join` opens a file in a
    journal a driver prepared (`RunJournal.join`). `shared`: other processes commit to this journal too (the Ray
    driver's: `finish` marks every rollout done). Raises JournalError naming the folder or file (in use, damaged,
    another run's, missing for `join`) before anything is committed."""
    if mode == "join":
        journal = RunJournal.join(directory, fingerprint)
    elif mode in ("resume", "fresh"):
        journal = RunJournal.prepare(directory, fingerprint, resume=mode == "resume", finished=frozenset(finished))
    else:
        raise ValueError(f"open_journal: mode must be 'resume', 'fresh' or 'join', got {mode!r}")
    journal.shared = shared
    return journal
