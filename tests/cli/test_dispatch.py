"""`main` calls the handler each command's parser sets (`func`), and the trust settings are a value each command builds
and passes down (nothing process-wide)."""

import argparse

import pytest

from gym_bridge.cli import build_parser, main
from gym_bridge.cli.common import trust_settings
from gym_bridge.core.errors import ConfigError
from gym_bridge.core.errors import UnknownEnvironmentError
from gym_bridge.core.registry import get_environment
from gym_bridge.core.trust import DEFAULT_TRUST, TrustSettings
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


def test_trust_settings_are_the_value_the_options_ask_for():
    verify = ["verify", "--data", "a.jsonl", "--output", "b.jsonl"]
    assert trust_settings(build_parser().parse_args([*verify, "--no-module-paths"])) == TrustSettings(module_prefixes=())
    assert trust_settings(build_parser().parse_args([*verify, "--allow-module", " my_co.envs. "])).module_prefixes == ("my_co.envs",)
    assert trust_settings(build_parser().parse_args(verify)) == DEFAULT_TRUST
    assert trust_settings(build_parser().parse_args(["eval", "--env", "weather", "--allow-row-commands"])).row_commands


def test_two_settings_side_by_side_in_one_process_give_their_own_answers():
    """With the module paths a process-wide toggle, the last one set answered for both; as values each answers for its run."""
    path = "tests.support.failing_env:AlwaysRight"
    shared, trusted = TrustSettings.limited_to([]), DEFAULT_TRUST  # `--no-module-paths` beside a library caller's default
    with pytest.raises(UnknownEnvironmentError, match="module paths are turned off"):
        get_environment(path, shared)
    assert get_environment(path, trusted).name == "always_right"
    with pytest.raises(UnknownEnvironmentError, match="module paths are turned off"):
        get_environment(path, shared)  # loaded and registered now, still refused to the run whose data is shared
    assert get_environment(path, TrustSettings.limited_to(["tests.support"])).name == "always_right"


def test_row_commands_with_limited_module_paths_are_refused_before_anything_runs():
    args = build_parser().parse_args(["eval", "--env", "weather", "--allow-row-commands", "--allow-module", "tests"])
    with pytest.raises(ConfigError, match="--allow-row-commands cannot be combined"):
        trust_settings(args)
    assert main(["eval", "--env", "weather", "--allow-row-commands", "--no-module-paths"]) == 2
