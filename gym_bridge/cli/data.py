"""`gym-bridge data validate|prepare|mix|to-verl`: task-row files checked, generated and mixed
(`gym_bridge.data`), and written as the parquet file verl's trainer reads."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gym_bridge.core.errors import ConfigError, GymBridgeError


UNKNOWN_ENV_HINT = ("hint: an environment of your own that is not installed is named by its module path: "
                    "pass --env my_package.my_module:MyEnvironment (rows then find it by its name), "
                    "or write that path as the rows' agent_ref.name")


def _data_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("data", help="task-row files: validate, prepare (generate), mix, to-verl")
    data = p.add_subparsers(dest="data_command", required=True)
    v = data.add_parser("validate", help="check every row against its environment; file:line: field for each problem")
    v.add_argument("files", nargs="+", metavar="FILE.jsonl")
    v.add_argument("--env", default=None, metavar="NAME", help="environment of rows that name none")
    v.set_defaults(func=_validate)
    g = data.add_parser("prepare", help="generate rows with an environment's generator")
    g.add_argument("env", metavar="ENV")
    g.add_argument("--split", choices=["train", "validation"], default="train")
    g.add_argument("--size", type=int, default=100, help="rows to generate")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--task", default=None, help="the generator's task (e.g. a reasoning-gym dataset name)")
    g.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a generator option (repeatable; VALUE is read as JSON when it parses, else as text)")
    g.add_argument("--output", required=True, metavar="FILE.jsonl")
    g.set_defaults(func=_prepare)
    m = data.add_parser("mix", help="a seeded, shuffled multi-environment file")
    m.add_argument("files", nargs="+", metavar="FILE.jsonl")
    m.add_argument("--weights", type=float, nargs="+", default=None, help="one weight per file (default: every row once)")
    m.add_argument("--num-rows", type=int, default=None, help="with --weights: rows to draw (default: all files' rows together)")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--output", required=True, metavar="FILE.jsonl")
    m.set_defaults(func=_mix)
    t = data.add_parser("to-verl", help="write task rows (JSONL) as the parquet file verl's trainer reads")
    t.add_argument("inputs", nargs="+", metavar="IN.jsonl", help="task rows (NeMo Gym format)")
    t.add_argument("--output", required=True, metavar="OUT.parquet")
    t.add_argument("--env", default=None, metavar="NAME", help="environment of rows that name none")
    t.add_argument("--limit", type=int, default=None, help="at most N rows per input file")
    t.set_defaults(func=_to_verl)


def _option_value(text: str) -> Any:
    import json

    try:
        return json.loads(text)
    except ValueError:
        return text


def _validate(args: argparse.Namespace) -> int:
    from gym_bridge import data as task_files

    if args.env:  # a typo fails here; a module path registers its class, so rows may use its name
        from gym_bridge.core.registry import get_environment

        get_environment(args.env)
    failed = unknown = False
    for path in args.files:
        report = task_files.validate_file(path, default_env=args.env)
        for problem in report.problems:
            print(problem, file=sys.stderr)
        for warning in report.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        print(f"{report.path}: {report.describe()}")
        failed = failed or not report.ok
        unknown = unknown or any(problem.message.startswith("unknown environment") for problem in report.problems)
    if unknown:
        print(UNKNOWN_ENV_HINT, file=sys.stderr)
    return 1 if failed else 0


def _prepare(args: argparse.Namespace) -> int:
    from gym_bridge import data as task_files

    options = {}
    for entry in args.set:
        key, sep, value = entry.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects KEY=VALUE, got {entry!r}")
        options[key] = _option_value(value)
    if args.task is not None:
        options["task"] = args.task
    rows = task_files.prepare(args.env, split=args.split, size=args.size, seed=args.seed, **options)
    print(f"wrote {len(rows)} rows to {task_files.write_rows(rows, args.output)}")
    return 0


def _to_verl(args: argparse.Namespace) -> int:
    from gym_bridge.verl._data import write_verl_parquet

    summary = write_verl_parquet(args.inputs, args.output, default_env=args.env, limit=args.limit)
    print(summary.describe())
    return 0


def _mix(args: argparse.Namespace) -> int:
    from gym_bridge import data as task_files
    from gym_bridge.core.output_file import check_not_an_input

    if args.weights is None and args.num_rows is not None:
        raise ConfigError("--num-rows needs --weights")
    check_not_an_input(args.output, args.files)
    try:
        rows = task_files.mix_files(args.files, weights=args.weights, seed=args.seed, num_rows=args.num_rows)
    except ValueError as error:
        if isinstance(error, GymBridgeError):
            raise
        raise ConfigError(str(error)) from None
    print(f"wrote {len(rows)} rows to {task_files.write_rows(rows, args.output)}")
    return 0
