"""Every `--help` text of `gym-bridge` stays byte-identical to the snapshot in data/help_texts.json."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.help_texts import COLUMNS, help_texts

SNAPSHOT = json.loads((Path(__file__).parent / "data" / "help_texts.json").read_text())


def test_every_command_of_the_snapshot_still_exists_and_no_new_one_is_missing_from_it():
    assert sorted(help_texts()) == sorted(SNAPSHOT)


@pytest.mark.parametrize("command", sorted(SNAPSHOT))
def test_help_text_is_unchanged(command):
    assert help_texts()[command] == SNAPSHOT[command]


def test_the_console_help_is_the_snapshot_text():
    """What `--help` prints is what the snapshot holds (same formatter, same width)."""
    env = {**os.environ, "COLUMNS": COLUMNS}
    shown = subprocess.run([sys.executable, "-m", "gym_bridge", "env", "check", "--help"], capture_output=True, text=True,
                           env=env, timeout=60, check=True).stdout
    assert shown == SNAPSHOT["env check"]
