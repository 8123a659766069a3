"""The `gym-bridge` command: `eval`, `verify`, `envs` and `serve-model`.

`eval` runs environments on a model (the embedded SmolLM2 by default, a local folder with
transformers or an in-process vLLM engine (`--backend vllm`), an OpenAI-compatible server with `--base-url`, or a hosted chat API with `--api chat|responses`) and
writes one rollout record per line plus `<output>.metrics.json`; `--resume` finishes a killed run.
`verify` re-scores stored rollouts without a model. `envs` lists what is registered.
`serve-model` serves a transformers model over an OpenAI-compatible HTTP API. `serve` serves
environments as NeMo Gym agent servers (`POST /run`, for NeMo RL). `data` checks, generates and
mixes task-row files (`gym_bridge.data`) and writes them as the parquet file verl's trainer reads.
`show`, `view` and `export` present stored rollouts (`gym_bridge.view`).
`env check` exercises an environment's tools and verifier without a model (`gym_bridge.eval.env_check`).

This package holds the parser (`build_parser` registers every subcommand, in the order `--help`
lists them; each sets its handler as `func`) and `main`, which calls it. One module per command
family: `eval` (eval and verify) with `eval_engine` (the model it runs: local, a server, Ray),
`serve` (serve-model and serve), `data`, `envs` (envs and env check); `common` holds what they share.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Sequence

from gym_bridge.cli.common import EXIT_BAD_INPUT, EXIT_INTERRUPTED
from gym_bridge.cli.data import _data_parser
from gym_bridge.cli.envs import _env_parser, _envs_parser
from gym_bridge.cli.eval import _eval_parser, _verify_parser
from gym_bridge.cli.serve import _agent_serve_parser, _serve_parser
from gym_bridge.core.errors import GymBridgeError, RolloutError
from gym_bridge.view import cli as view_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gym-bridge", description="RL environments for language models, inside your trainer.")
    sub = parser.add_subparsers(dest="command", required=True)
    _eval_parser(sub)
    _verify_parser(sub)
    _envs_parser(sub)
    _serve_parser(sub)
    _agent_serve_parser(sub)
    _data_parser(sub)
    view_cli.add_parsers(sub)
    _env_parser(sub)
    for command in sub.choices.values():  # so an unknown option is reported by the command it was given to
        command.set_defaults(command_parser=command)
    return parser


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, parsed; an option the command does not have stops it (exit 2) with that command's usage,
    naming the option and the command's closest one (`--max-tokens`: did you mean `--max-new-tokens`?)."""
    args, unknown = build_parser().parse_known_args(argv)
    command: argparse.ArgumentParser = vars(args).pop("command_parser")  # not a setting: kept out of what runs see
    if unknown:
        command.error(unknown_arguments_message(unknown, command))
    return args


def unknown_arguments_message(unknown: Sequence[str], command: argparse.ArgumentParser) -> str:
    """`unrecognized arguments: ...`, with the closest option of `command` to each unknown one."""
    import difflib

    known = [option for action in command._actions for option in action.option_strings]  # argparse keeps no public list
    hints = []
    for flag in (word.partition("=")[0] for word in unknown if word.startswith("-")):
        if close := difflib.get_close_matches(flag, known, n=1):
            hints.append(f"did you mean {close[0]} for {flag}?")
    return f"unrecognized arguments: {' '.join(unknown)}" + (f" ({'; '.join(hints)})" if hints else "")


def _import_from_working_directory() -> None:
    """Environments named by module path (`my_env:MyEnv`) are found in the current directory, as with
    `python -m`: the `gym-bridge` script alone would not look there. Appended, so it shadows no package."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command `argv` names (its parser's `func`); returns the exit code. A GymBridgeError that is not a
    rollout's, or a missing file, is printed as `error: ...` (exit 2); Ctrl-C exits 130."""
    import faulthandler

    args = parse_arguments(argv)
    command: Callable[[argparse.Namespace], int] = vars(args).pop("func")  # not a setting: kept out of what runs see
    _import_from_working_directory()
    if not faulthandler.is_enabled():  # a segfault in environment or model code prints where it happened
        faulthandler.enable()
    try:
        return command(args)
    except RolloutError:  # a rollout's failure outside a rollout (a backend gone at start-up): a crash, as any bug
        raise
    except GymBridgeError as error:  # a UserError (or a bare GymBridgeError): the message says what to fix
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        where = f": finished rollouts are in {args.output}; rerun with --resume to finish" if args.command == "eval" else ""
        print(f"interrupted{where}", file=sys.stderr)
        return EXIT_INTERRUPTED
