"""`main` calls the handler each command's parser sets (`func`), and the trust settings last for the command only."""

import argparse

import pytest

from gym_bridge.cli import build_parser, main
from gym_bridge.cli.common import TrustSettings, trusting
from gym_bridge.core.errors import ConfigError
from gym_bridge.core.registry import module_paths_limited
from tests.cli.help_texts import _commands


def test_every_command_that_runs_has_a_handler():
    leaves = {path: parser for path, parser in _commands(build_parser())
              if not any(isinstance(action, argparse._SubParsersAction) for action in parser._actions)}
    assert "env check" in leaves and "data prepare" in leaves and "eval" in leaves
    assert {path for path, parser in leaves.items() if not callable(parser.get_default("func"))} == set()


def test_the_handler_is_not_a_setting_runs_see(monkeypatch):
    seen = []
    parser = build_parser()
    parser._subparsers._group_actions[0].choices["envs"].set_defaults(func=lambda args: seen.append(vars(args)) or 7)
    monkeypatch.setattr("gym_bridge.cli.build_parser", lambda: parser)
    assert main(["envs"]) == 7
    assert seen == [{"command": "envs"}]


def test_trust_settings_apply_for_the_block_and_are_restored():
    args = build_parser().parse_args(["verify", "--data", "a.jsonl", "--output", "b.jsonl", "--no-module-paths"])
    assert not module_paths_limited()
    with trusting(TrustSettings.from_args(args)):
        assert module_paths_limited()
    assert not module_paths_limited()


def test_row_commands_with_limited_module_paths_are_refused_before_anything_is_set():
    args = build_parser().parse_args(["eval", "--env", "weather", "--allow-row-commands", "--allow-module", "tests"])
    with pytest.raises(ConfigError, match="--allow-row-commands cannot be combined"):
        TrustSettings.from_args(args)
    assert main(["eval", "--env", "weather", "--allow-row-commands", "--no-module-paths"]) == 2
    assert not module_paths_limited()
