"""The durable per-turn journal of a run's rollouts in flight, so a killed run continues each episode from its last finished turn.

An append-only log of checksummed frames, not a temp file renamed per rollout: a commit writes only its new turn, and
the commits of all rollouts in flight share one fsync (group commit). A rollout waits for its commit's fsync before its
next model call, so a crash loses at most the turn in flight of each rollout. A torn last frame (never acknowledged)
is ignored; a damaged earlier frame or another run's journal is refused with `JournalError` naming the file.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import struct
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Iterable, Iterator, Literal, Mapping, Sequence

import orjson

from gym_bridge.core.errors import UserError
from gym_bridge.core.task import Task

ResumeKind = Literal["snapshot", "replay", "restart"]
"""How an environment's session comes back after a crash: `snapshot` (its `restore` hook), `replay` (the logged tool
calls are run again in a fresh session and each output checked), `restart` (from turn 0)."""
RolloutKey = tuple[int, int]
"""(task index, repeat index)."""
JOURNAL_VERSION = 1
_MAGIC = b"GBJ1"
_HEADER = struct.Struct("<4sII")
"""Magic, payload length, CRC-32 of the payload."""


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
                  env_classes: Iterable[type[Any]] = ()) -> RunFingerprint:
        """The fingerprint of a run of `config` (an `EngineConfig`) over `tasks`: every setting but the concurrency
        bounds, which do not change a rollout (a run may resume with another `--concurrency`), plus `repeats` (rollouts
        per task: a resume with fewer would leave groups uneven) and the settings of `env_classes` (`environment_settings`)."""
        settings = {key: value for key, value in dataclasses.asdict(config).items()
                    if key not in ("max_concurrency", "per_env_concurrency", "model_name")}
        if repeats is not None:
            settings["num_repeats"] = repeats
        settings.update(environment_settings(env_classes))
        return cls.of_run(model=config.model_name, tasks=tasks, settings=settings)

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
    events: list[dict[str, Any]]
    """In order: `model` (one model call), `tool` (one tool call and its output), `user` (a user message)."""
    budgets: dict[str, Any]
    """At the last commit: `turns` (model calls), `tokens` (after the prompt), `seconds` (over all attempts)."""
    kind: str
    snapshot: Any = None
    snapshot_version: int | None = None

    @property
    def turns(self) -> int:
        return sum(1 for event in self.events if event["t"] in ("model", "chat"))

    def to_frame(self) -> dict[str, Any]:
        return {"k": "commit", "r": list(self.key), "a": self.attempt, "at": 0, "ev": self.events, "b": self.budgets,
                "kind": self.kind, "snap": self.snapshot, "sv": self.snapshot_version}


def encode_frame(payload: Mapping[str, Any]) -> bytes:
    """One frame: magic, length, CRC-32, then the payload as JSON."""
    try:
        body = orjson.dumps(payload)  # the common frame: string keys, plain values (a quarter faster than with options)
    except TypeError:
        body = orjson.dumps(payload, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)
    return _HEADER.pack(_MAGIC, len(body), zlib.crc32(body)) + body


def read_frames(path: Path) -> Iterator[dict[str, Any]]:
    """The frames of one segment. Stops at a torn last frame (an unacknowledged write); raises JournalError for a
    damaged frame that is not the last, or bytes that are not a journal."""
    data = path.read_bytes()
    offset = 0
    while offset < len(data):
        if len(data) - offset < _HEADER.size:
            return  # torn header at the end
        magic, length, crc = _HEADER.unpack_from(data, offset)
        if magic != _MAGIC:
            raise JournalError(f"{path}: not a gym_bridge journal frame at byte {offset} (damaged, or not a journal); "
                               "remove the file to restart its rollouts from turn 0")
        end = offset + _HEADER.size + length
        if end > len(data):
            return  # torn body at the end
        body = data[offset + _HEADER.size:end]
        if zlib.crc32(body) != crc:
            if end == len(data):
                return  # the last write, cut off before it was durable
            raise JournalError(f"{path}: frame at byte {offset} fails its checksum and is not the last one (the file is "
                               "damaged); remove it to restart its rollouts from turn 0")
        try:
            frame = orjson.loads(body)
        except orjson.JSONDecodeError as error:
            raise JournalError(f"{path}: frame at byte {offset} passes its checksum but is not JSON ({error})") from None
        yield frame
        offset = end


def journal_dir_for(output: str | Path) -> Path:
    """Where `gym-bridge eval --output FILE` keeps its journal: `FILE.journal/`."""
    output = Path(output)
    return output.with_name(output.name + ".journal")


class RunJournal:
    """The journal of one run: `prepare` it (reading what an earlier, killed run left), `restore` each rollout's
    committed state, `commit` at turn boundaries, `finish` a rollout once its record is written, `close` at the end.

    One process writes one segment; `prepare` folds the segments it found into its own (one frame per rollout still
    in flight) before removing them, so a crash at any moment leaves a readable journal.
    """

    def __init__(self, directory: Path, fingerprint: RunFingerprint, *, fsync: bool = True) -> None:
        self.directory = directory
        self.fingerprint = fingerprint
        self.fsync = fsync
        self.segment = directory / f"{time.time_ns():020d}-{os.getpid()}.log"
        self._fd: int | None = None
        self._states: dict[RolloutKey, RolloutState] = {}
        self._live: set[RolloutKey] = set()
        """Rollouts with committed frames in this segment and no `finish` yet."""
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
        `finished`) are read and carried into this run's segment; without it, an old journal is discarded.

        Raises JournalError for a damaged journal or one of another run (naming the file and what differs).
        """
        journal = cls(Path(directory), fingerprint, fsync=fsync)
        journal.directory.mkdir(parents=True, exist_ok=True)
        old = sorted(journal.directory.glob("*.log"))
        if resume:
            journal._states = {key: state for key, state in journal._read(old).items() if key not in finished}
        journal._fd = os.open(journal.segment, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        frames = [encode_frame({"k": "header", "v": JOURNAL_VERSION, "fingerprint": fingerprint.to_dict()})]
        frames += [encode_frame(state.to_frame()) for state in journal._states.values()]
        journal._write(b"".join(frames))
        _fsync_dir(journal.directory)
        journal._live = set(journal._states)
        for path in old:
            path.unlink()
        return journal

    @classmethod
    def join(cls, directory: str | Path, fingerprint: RunFingerprint, *, fsync: bool = True) -> RunJournal:
        """Open a segment of its own in the journal a driver prepared in `directory` (a Ray worker's): nothing is read
        or removed here; `load` reads the committed state of the rollouts this process is sent again.

        Raises JournalError when `directory` is not there (a node that does not share the driver's file system)."""
        journal = cls(Path(directory), fingerprint, fsync=fsync)
        if not journal.directory.is_dir():
            raise JournalError(f"the journal directory {journal.directory} does not exist on this node: the workers must "
                               "see the driver's --output directory (a shared file system at the same path)")
        journal._fd = os.open(journal.segment, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        journal._write(encode_frame({"k": "header", "v": JOURNAL_VERSION, "fingerprint": fingerprint.to_dict()}))
        _fsync_dir(journal.directory)
        return journal

    def load(self, keys: Sequence[RolloutKey]) -> None:
        """Read what every segment of the directory holds for `keys` (rollouts sent again after their process died), for
        `restore`. Raises JournalError for a damaged segment or one of another run."""
        wanted = set(keys)
        found = self._read(sorted(self.directory.glob("*.log")))
        self._states.update({key: state for key, state in found.items() if key in wanted})

    def pending(self) -> list[RolloutKey]:
        """The rollouts `prepare` found in flight that no process has restored yet, in order."""
        return sorted(self._states)

    def has_state(self, key: RolloutKey) -> bool:
        """Whether `prepare` found committed turns of rollout `key` that no process has restored yet."""
        return key in self._states

    def _read(self, segments: Sequence[Path]) -> dict[RolloutKey, RolloutState]:
        """The rollouts in flight over all `segments`. One attempt of a rollout runs in one process (one segment), and a
        later attempt continues the events of the earlier ones: a rollout's commits are applied in attempt order."""
        commits: dict[RolloutKey, list[tuple[int, int, int, dict[str, Any], Path]]] = {}
        done: set[RolloutKey] = set()
        for number, path in enumerate(segments):
            frames = read_frames(path)
            header = next(frames, None)
            if header is None:
                continue  # killed before its header was written: holds nothing
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

    def commit(self, key: RolloutKey, *, attempt: int, at: int, events: list[dict[str, Any]], budgets: dict[str, Any],
               kind: str, snapshot: Any = None, snapshot_version: int | None = None) -> Awaitable[None]:
        """Append rollout `key`'s events after its first `at` committed ones, with its budgets (and its environment's
        snapshot). Returns what to await: done once they are durable, fsynced with the other commits of this moment."""
        frame = {"k": "commit", "r": key, "a": attempt, "at": at, "ev": events, "b": budgets, "kind": kind}
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
        `complete`: every rollout of the run has its record, so the segments of other processes (Ray workers) go too."""
        if self._flusher is not None:
            await asyncio.shield(self._flusher)
        if self._frames:
            data, self._frames = b"".join(self._frames), []
            self._write(data)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if complete:
            for path in self.directory.glob("*.log"):
                path.unlink(missing_ok=True)
        if complete or (not self.in_flight and not self.shared):  # shared: its `done` frames speak for others' commits
            self.segment.unlink(missing_ok=True)
            try:
                self.directory.rmdir()
            except OSError:
                pass  # something else lives there (another process's segment of a run cut off)

    def _schedule(self) -> None:
        if self._flusher is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # `finish` called outside an event loop: write at once
            data, self._frames = b"".join(self._frames), []
            self._write(data)
            return
        self._flusher = loop.create_task(self._flush())

    async def _flush(self) -> None:
        """Write and fsync what commits have buffered, then wake them; commits arriving meanwhile form the next group."""
        try:
            while self._frames:
                data, waiters = b"".join(self._frames), self._waiters
                self._frames, self._waiters = [], []
                try:
                    self._write(data, sync=False)
                    if self.fsync and self._fd is not None:
                        await asyncio.to_thread(os.fsync, self._fd)
                except OSError as error:
                    failure = JournalError(f"{self.segment}: cannot write the journal: {error}")
                    for waiter in waiters:
                        if not waiter.done():
                            waiter.set_exception(failure)
                    continue
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)
        finally:
            self._flusher = None

    def _write(self, data: bytes, *, sync: bool = True) -> None:
        if self._fd is None:
            raise JournalError(f"{self.segment}: the journal is closed")
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        if sync and self.fsync:
            os.fsync(self._fd)


def _frame_key(frame: Mapping[str, Any], path: Path) -> tuple[Any, RolloutKey]:
    kind, key_list = frame.get("k"), frame.get("r")
    if not (isinstance(key_list, list) and len(key_list) == 2):
        raise JournalError(f"{path}: a {kind!r} frame names no rollout")
    return kind, (int(key_list[0]), int(key_list[1]))


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
    state.events[at:] = list(frame["ev"])
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
