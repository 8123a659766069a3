"""The `show`, `view` and `export` commands, and `eval`'s tool-call alarm options.

Kept apart from the `gym_bridge.cli` package, which only registers them; imports stay lazy (no
tokenizer or template is loaded until a command runs).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from gym_bridge.cli.common import number, whole_number
from gym_bridge.core.errors import ConfigError
from gym_bridge.core.health import HealthSettings

if TYPE_CHECKING:
    from gym_bridge.view.reading import Skipped



def health_arguments(parser: argparse.ArgumentParser) -> None:
    """`--no-tool-call-after N` and `--max-parse-error-rate F` (see `HealthSettings`); bad values exit 2 at parse time."""
    defaults = HealthSettings()
    parser.add_argument("--no-tool-call-after", type=whole_number(0), default=defaults.no_tool_call_after, metavar="N",
                        help="warn when an environment that offers tools sees no tool call in its first N rollouts (0: never)")
    parser.add_argument("--max-parse-error-rate", type=number(at_least=0, at_most=1), default=defaults.max_parse_error_rate, metavar="F",
                        help=f"warn when more than this share of tool calls cannot be parsed (judged after {defaults.min_attempts} calls)")


def health_settings(args: argparse.Namespace) -> HealthSettings:
    return HealthSettings(no_tool_call_after=args.no_tool_call_after, max_parse_error_rate=args.max_parse_error_rate)


def _selection_arguments(parser: argparse.ArgumentParser) -> None:
    from gym_bridge.view.reading import SORT_KEYS

    parser.add_argument("--env", action="append", default=[], metavar="NAME", help="only rollouts of this environment (repeatable)")
    parser.add_argument("--failed", action="store_true", help="only rollouts that failed (a failure kind is set)")
    parser.add_argument("--sort", default="file", choices=SORT_KEYS,
                        help="order: reward (worst first), best (highest reward first), latency/turns/tokens (largest first), file")
    parser.add_argument("--tokenizer", default=None, metavar="PATH",
                        help="tokenizer folder to decode token ids (default: the record's model folder, or the embedded "
                             "tokenizer for the embedded model; otherwise ids are shown)")


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser("show", help="print rollouts as chat transcripts (prompt as the model saw it, tool calls, reward)")
    s.add_argument("rollouts", metavar="ROLLOUTS.jsonl")
    _selection_arguments(s)
    s.add_argument("-n", type=int, default=5, metavar="N", help="rollouts to print at most (0: all) (default: 5)")
    s.add_argument("--tokens", action="store_true", help="also print the completion as trained (model) and masked (env) token runs")
    s.add_argument("--color", choices=["auto", "always", "never"], default="auto", help="colour (default: auto, when the output is a terminal)")
    s.set_defaults(func=_show)
    v = sub.add_parser("view", help="write one self-contained HTML report of rollouts (two files: compared side by side)")
    v.add_argument("rollouts", nargs="+", metavar="ROLLOUTS.jsonl", help="one file, or two to compare (A B: per-task reward differences)")
    _selection_arguments(v)
    v.add_argument("--output", default="report.html", metavar="FILE.html", help="where to write the report")
    v.add_argument("--max-detail", type=int, default=2000, metavar="N",
                   help="rollouts whose conversation and tokens are embedded, at most; beyond it a seeded sample (default: 2000)")
    v.add_argument("--seed", type=int, default=0, help="seed of that sample (default: 0)")
    v.set_defaults(func=_view)
    e = sub.add_parser("export", help="write rollouts in another format: Harbor's ATIF v1.7 trajectories")
    e.add_argument("rollouts", metavar="ROLLOUTS.jsonl")
    e.add_argument("--format", choices=["atif"], required=True, help="atif: ATIF-v1.7 (one trajectory per rollout)")
    e.add_argument("--output", required=True, metavar="OUT",
                   help="a .jsonl file (one trajectory per line) or a folder (one <env>-<task>-<repeat>.json each)")
    e.set_defaults(func=_export)


def _report_skipped(skipped: list[Skipped]) -> int:
    """Print each skipped line to stderr; the exit status: 0 when none was skipped, 1 otherwise."""
    for entry in skipped:
        print(entry, file=sys.stderr)
    if skipped:
        print(f"skipped {len(skipped)} unreadable records (see above)", file=sys.stderr)
    return 1 if skipped else 0


def _show(args: argparse.Namespace) -> int:
    from gym_bridge.view.decode import decoder_for
    from gym_bridge.view.show import format_rollout
    from gym_bridge.view.reading import iter_rollouts, require_some, select

    if args.n < 0:
        raise ConfigError("-n must be >= 0")
    skipped: list[Skipped] = []
    selection = select(iter_rollouts(args.rollouts, skipped=skipped), envs=args.env, failed=args.failed, sort=args.sort, limit=args.n)
    require_some(skipped, selection.total)
    shown = selection.chosen
    decoder = decoder_for([record for _, record in shown], tokenizer=args.tokenizer)
    colour = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    for position, record in shown:
        print(format_rollout(position, record, decoder, tokens=args.tokens, colour=colour))
        print()
    print(f"showed {len(shown)} of {selection.selected} selected rollouts ({selection.total} in the file)"
          + ("; -n 0 shows all" if len(shown) < selection.selected else ""))
    return _report_skipped(skipped)


def _view(args: argparse.Namespace) -> int:
    from gym_bridge.view.report import write_report

    if len(args.rollouts) > 2:
        raise ConfigError("view takes one rollout file, or two to compare")
    if args.max_detail < 0:
        raise ConfigError("--max-detail must be >= 0")
    skipped: list[Skipped] = []
    report = write_report(args.rollouts, output=args.output, envs=args.env, failed=args.failed, sort=args.sort,
                          tokenizer=args.tokenizer, max_detail=args.max_detail, seed=args.seed, skipped=skipped)
    print(report.describe())
    return _report_skipped(skipped)


def _export(args: argparse.Namespace) -> int:
    from gym_bridge.view.atif import export_atif

    skipped: list[Skipped] = []
    count, where = export_atif(args.rollouts, output=args.output, skipped=skipped)
    print(f"wrote {count} ATIF-v1.7 trajectories to {where}")
    return _report_skipped(skipped)


def verify_input(path: str, temp_dir: str) -> str:
    """`gym-bridge verify --data`: ATIF trajectories become rollout records in `temp_dir` first; other files pass through."""
    from gym_bridge.view.atif import is_atif_file, write_records_from_atif

    if not is_atif_file(path):
        return path
    return str(write_records_from_atif(path, output=f"{temp_dir}/from_atif.jsonl"))
