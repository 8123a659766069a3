"""Every `gym-bridge ... --help` text, keyed by its command path (`""`, `"eval"`, `"env check"`), at a fixed width.

`python -m tests.cli.help_texts > tests/cli/data/help_texts.json` rewrites the snapshot that
tests/cli/test_help_texts.py compares with: only when a brief asks for a help text to change.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator
from unittest import mock

from gym_bridge.cli import build_parser

COLUMNS = "100"
"""The terminal width argparse wraps help at (it reads $COLUMNS)."""


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield " ".join(path), parser
    for action in parser._actions:  # argparse keeps no public list of subparsers
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _commands(child, (*path, name))


def help_texts() -> dict[str, str]:
    """The help text of every command and subcommand, by command path."""
    with mock.patch.dict(os.environ, {"COLUMNS": COLUMNS}):
        return {path: parser.format_help() for path, parser in _commands(build_parser())}


if __name__ == "__main__":
    print(json.dumps(help_texts(), indent=1, sort_keys=True))
