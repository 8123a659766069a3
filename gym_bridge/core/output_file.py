"""Output files of the data commands and `eval`: a path that can be a file, never one of their own inputs, and
replaced atomically.

A file is written beside its final name and renamed onto it once complete (after an fsync), so an
interrupted `data mix|prepare|to-verl` leaves the old file whole, never a prefix of the new one.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from gym_bridge.core.errors import ConfigError


def check_not_an_input(output: str | Path, inputs: Sequence[str | Path], *, flag: str = "--output") -> None:
    """Raise GymBridgeError when `output` is one of `inputs` (the same file, by any path to it)."""
    for path in inputs:
        if _same_file(Path(output), Path(path)):
            raise ConfigError(f"{flag} {output} is also an input ({path}): it would be overwritten while read; choose another {flag}")


def check_file_path(output: str | Path, *, flag: str = "--output") -> None:
    """Raise ConfigError naming `flag` when `output` cannot become a file: it is a folder (or ends with a separator),
    or a path under something that is not a folder (`notes.txt/run.jsonl`)."""
    text = str(output)
    path = Path(output).expanduser()
    if path.is_dir() or text.endswith(("/", os.sep)):
        raise ConfigError(f"{flag} {output} is a folder; name a file in it, e.g. {flag} {path / 'rollouts.jsonl'}")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"{flag} {output}: {parent} is a file, not a folder; choose another {flag}")
            return


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.samefile(b)
    except OSError:  # one of them does not exist (yet)
        return a.resolve() == b.resolve()


@contextmanager
def replaced_atomically(path: str | Path) -> Iterator[Path]:
    """A temporary path beside `path` to write; renamed onto `path` when the block ends, removed if it raises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield temp
        with temp.open("rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)
