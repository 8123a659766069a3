"""`gym-bridge envs` (the registered environments, their example data and settings) and
`gym-bridge env check` (an environment's tools and verifier exercised without a model, `gym_bridge.eval.env_check`)."""

from __future__ import annotations

import argparse
import asyncio
import sys

from gym_bridge.cli.common import _module_path_arguments, trust_settings


def _envs_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub.add_parser("envs", help="list the registered environments").set_defaults(func=_envs)


def _envs(_: argparse.Namespace) -> int:
    from gym_bridge.core.registry import broken_environments, known_environments

    environments = known_environments()
    width = max([14, *map(len, environments)])
    for name, env_class in environments.items():
        data = env_class.example_data
        print(f"{name:<{width}} {env_class.description}\n{'':<{width}} data: {data if data else '-'}")
        if env_class.settings:
            print(f"{'':<{width}} settings: {', '.join(env_class.settings)}")
    for name, reason in broken_environments().items():
        print(f"{name:<{width}} BROKEN: {reason}", file=sys.stderr)
    return 1 if broken_environments() else 0


def _env_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("env", help="for environment authors: check an environment without a model")
    env = p.add_subparsers(dest="env_command", required=True)
    c = env.add_parser("check", help="validate rows, show what the model is shown, run scripted tool calls and verify known answers")
    c.add_argument("env", metavar="ENV", help="environment name or module path, e.g. my_env:OrderStatus (found in the current directory)")
    c.add_argument("--data", action="append", default=[], metavar="FILE.jsonl", help="task rows (default: the environment's example data)")
    c.add_argument("--limit", type=int, default=3, help="rows to check")
    c.add_argument("--call", action="append", default=[], metavar="NAME=JSON",
                   help="a tool call of the scripted trajectory, run on each row's session, e.g. lookup='{\"order_id\": \"42\"}' (repeatable, in order)")
    c.add_argument("--answer", default=None, help="final answer to verify (default: the row's expected_answer, ground_truth, answer, ...)")
    _module_path_arguments(c)
    c.set_defaults(func=_env_check)


def _env_check(args: argparse.Namespace) -> int:
    from gym_bridge.eval.env_check import check_environment, parse_call

    calls = [parse_call(text) for text in args.call]
    problems = asyncio.run(check_environment(args.env, data_paths=args.data, calls=calls, answer=args.answer, limit=args.limit,
                                             trust=trust_settings(args)))
    return 1 if problems else 0
