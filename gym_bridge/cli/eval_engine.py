"""The engine `gym-bridge eval` runs: a local model (transformers, or an in-process vLLM engine), an
OpenAI-compatible server (`--base-url`: live replicas, the served model's name, a tokenizer checked
against the server's) or a hosted chat API, with `--env-setting` / `--env-url` applied; and, with
`--ray`, the same engine built inside Ray workers."""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from gym_bridge.cli.common import (EMBEDDED_MODEL_NAME, _load_average, model_flag_errors,
                                   torch_threads)
from gym_bridge.core.errors import ConfigError, SetupError
from gym_bridge.core.trust import TrustSettings


def _load_policy(model: str | None) -> Any:
    from gym_bridge.policies.factory import PolicySpec, build_policy
    from gym_bridge.policies.transformers import cpu_threads

    cpu_threads(torch_threads(None, default=cpu_threads(), cores=os.cpu_count() or 1, load=_load_average()))
    return build_policy(PolicySpec(kind="transformers", model=model))


def _local_setup(args: argparse.Namespace) -> tuple[Any, Any, str]:
    """The policy, chat template and model name for `eval` on a local model (--backend transformers or vllm)."""
    from gym_bridge.core.template.chat_template import ChatTemplate

    model_name = args.model or f"{EMBEDDED_MODEL_NAME} (embedded)"
    if args.backend == "vllm":
        from gym_bridge.policies.embedded import embedded_model_path
        from gym_bridge.policies.factory import PolicySpec, build_policy
        from gym_bridge.policies.tokenizer import load_tokenizer

        path = args.model or str(embedded_model_path())
        loaded = model_flag_errors(args.model, load_tokenizer, path)
        policy = build_policy(PolicySpec(kind="vllm", model=path, seed=args.seed, logprobs_mode="raw",
                                         gpu_memory_utilization=args.gpu_memory_utilization))
        return policy, ChatTemplate(loaded.tokenizer, eos_token_ids=loaded.eos_token_ids), model_name
    policy = model_flag_errors(args.model, _load_policy, args.model)
    return policy, ChatTemplate(policy.tokenizer, eos_token_ids=sorted(policy.eos_token_ids)), model_name


def _base_urls(args: argparse.Namespace) -> list[str]:
    return [url.strip() for entry in args.base_url for url in entry.split(",") if url.strip()]


async def _remote_setup(args: argparse.Namespace) -> tuple[Any, Any, str]:
    """The policy, chat template (None for chat APIs) and model name for `eval --base-url`.

    Raises GymBridgeError for what a user must fix: no model name to be had, a model the server
    does not serve, a tokenizer that does not match the server's.
    """
    from gym_bridge.core.errors import BackendError

    urls = _base_urls(args)
    api_key = os.environ.get(args.api_key_env) or None
    if args.api != "completions":
        from gym_bridge.policies.factory import PolicySpec, build_policy

        if len(urls) != 1 or not args.model:
            raise ConfigError(f"--api {args.api} needs exactly one --base-url and --model NAME")
        policy = build_policy(PolicySpec(kind="chat", model=args.model, base_urls=(urls[0],), api=args.api, api_key=api_key,
                                         request_timeout_s=args.request_timeout_s, max_retries=args.max_retries))
        return policy, None, args.model

    from gym_bridge.policies.factory import PolicySpec, build_policy
    from gym_bridge.policies.http import ServerUnreachableError

    urls = await _live_base_urls(urls, api_key=api_key, timeout_s=min(args.request_timeout_s, 30.0))
    try:
        models = await _served_models_once_up(urls[0], api_key=api_key, timeout_s=min(args.request_timeout_s, 30.0),
                                              wait_s=args.wait_for_server_s)
    except BackendError as error:
        if not args.model and isinstance(error, ServerUnreachableError):
            waited = f", also after waiting {args.wait_for_server_s:g} s" if error.refused and args.wait_for_server_s else ""
            raise SetupError(f"no server answers at {urls[0]} ({error}{waited}): start it first (e.g. `gym-bridge serve-model "
                                 "--port 8000`) or fix --base-url") from None
        if not args.model:
            raise SetupError(f"cannot learn the served model's name ({error}); pass --model NAME") from None
        print(f"warning: {error}; rollouts will fail as `infra` while no server answers", file=sys.stderr)
        models = []
    ids = [entry["id"] for entry in models]
    if args.model and models and args.model not in ids:
        raise SetupError(f"{urls[0]} does not serve --model {args.model!r}; it serves {ids}")
    if not args.model and len(ids) != 1:
        raise SetupError(f"{urls[0]} serves {len(ids)} models {ids}; pick one with --model NAME")
    model = args.model or ids[0]
    entry = next((entry for entry in models if entry["id"] == model), {})
    path, source = _remote_tokenizer_path(args.tokenizer, model, entry)
    loaded = await _matching_tokenizer(urls[0], path, model=model, api_key=api_key, source=source, server_up=bool(models))
    policy = build_policy(PolicySpec(kind="remote", model=model, base_urls=tuple(urls), api_key=api_key,
                                     request_timeout_s=args.request_timeout_s, max_retries=args.max_retries,
                                     vocab_size=len(loaded.tokenizer)))
    from gym_bridge.core.template.chat_template import ChatTemplate

    return policy, ChatTemplate(loaded.tokenizer, eos_token_ids=loaded.eos_token_ids), model


async def _served_models_once_up(url: str, *, api_key: str | None, timeout_s: float, wait_s: float,
                                 poll_s: float = 0.5) -> list[dict[str, Any]]:
    """`served_models(url)`, asked again every `poll_s` for up to `wait_s` while the connection is refused (a server
    started just before `eval`, as in a pasted script, is still loading its model); says once that it waits.
    Raises what `served_models` raises (ServerUnreachableError once `wait_s` has passed)."""
    from gym_bridge.policies.http import ServerUnreachableError
    from gym_bridge.policies.discovery import served_models

    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            return await served_models(url, api_key=api_key, timeout_s=timeout_s)
        except ServerUnreachableError as error:
            if not error.refused or time.monotonic() + poll_s > deadline:
                raise
            if not said:
                print(f"waiting up to {wait_s:g} s for a server at {url} to start (connection refused; "
                      "--wait-for-server-s changes this)", file=sys.stderr)
                said = True
            await asyncio.sleep(poll_s)


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




async def _matching_tokenizer(base_url: str, path: str, *, model: str, api_key: str | None, source: str, server_up: bool) -> Any:
    """The tokenizer in `path`, checked against the server's `/tokenize` on a probe text (skipped when the
    server has none). It is loaded without transformers (fast start) unless that one disagrees with the
    server, or cannot be checked and its class is one transformers rebuilds in code."""
    from gym_bridge.policies.discovery import TOKENIZER_PROBE, served_token_ids
    from gym_bridge.policies.tokenizer import GENERIC_TOKENIZER_CLASSES, load_tokenizer

    loaded = load_tokenizer(path)
    served = await served_token_ids(base_url, TOKENIZER_PROBE, model=model, api_key=api_key) if server_up else None
    if loaded.light:
        disagrees = served is not None and served != loaded.tokenizer.encode(TOKENIZER_PROBE, add_special_tokens=False)
        unchecked = served is None and loaded.tokenizer.tokenizer_class not in GENERIC_TOKENIZER_CLASSES
        if disagrees or unchecked:
            loaded = load_tokenizer(path, light=False)
    if served is not None and served != loaded.tokenizer.encode(TOKENIZER_PROBE, add_special_tokens=False):
        raise SetupError(
            f"{source} does not tokenize like the server's model {model!r}; pass --tokenizer PATH with the served model's tokenizer"
        )
    return loaded


def _apply_env_options(env_settings: Sequence[str], env_urls: Sequence[str], trust: TrustSettings) -> None:
    """`--env-setting NAME.KEY=VALUE` and `--env-url NAME=URL` (a NAME that is a module path only where `trust` allows
    it); raises GymBridgeError on a malformed one."""
    import json

    from gym_bridge.core.registry import REMOTE_ENVIRONMENT, configure, get_environment

    for entry in env_settings:
        target, sep, raw = entry.partition("=")
        name, dot, key = target.rpartition(".")
        if not (sep and dot and name and key):
            raise ConfigError(f"--env-setting takes NAME.KEY=VALUE, got {entry!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        configure(name, trust, **{key: value})
    for entry in env_urls:
        name, sep, url = entry.partition("=")
        if not (sep and name and url.startswith(("http://", "https://"))):
            raise ConfigError(f"--env-url takes NAME=URL with an http(s) URL, got {entry!r}")
        bind: Callable[[str, str], object] | None = getattr(get_environment(REMOTE_ENVIRONMENT), "bind", None)
        if bind is None:
            raise ConfigError(f"--env-url needs the {REMOTE_ENVIRONMENT} environment's bind(name, url); the one registered has none")
        bind(name, url)


async def _build_engine(args: argparse.Namespace, trust: TrustSettings) -> Any:
    """The engine `eval` runs: its policy (a server's, or a local model), chat template, settings and `trust`."""
    from gym_bridge.core.agent_loop import Limits
    from gym_bridge.core.engine import Engine, EngineConfig
    from gym_bridge.core.policy import SamplingParams

    if _base_urls(args):
        if args.backend != "transformers":
            raise ConfigError(f"--backend {args.backend} runs a model in this process; drop it or --base-url")
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
    return Engine(policy, template, config, trust=trust)


@dataclass(frozen=True)
class EvalEngineFactory:
    """Builds `eval`'s engine inside a Ray worker from the driver's arguments: the same environment
    settings, policy and template as the driver's (the model name and the live replicas as the driver found
    them), and the driver's `trust` (pickled with the factory: each worker's engine holds it)."""

    args: dict[str, Any]
    trust: TrustSettings

    def __call__(self) -> Any:
        from concurrent.futures import ThreadPoolExecutor

        args = argparse.Namespace(**self.args)
        _apply_env_options(args.env_setting, args.env_url, self.trust)
        with ThreadPoolExecutor(1) as thread:  # an actor's own event loop may already run in this thread
            return thread.submit(asyncio.run, _build_engine(args, self.trust)).result()


def _ray_rollouts(args: argparse.Namespace, engine: Any, tasks: Any) -> Any:
    """`eval --ray`: the rollouts of `engine`'s settings on Ray workers; their workers are started and
    checked here, and every hop's concurrency stated, before any rollout runs."""
    from gym_bridge.scale.ray_runner import RayRollouts

    worker_args = {**vars(args), "model": engine.config.model_name if _base_urls(args) else args.model,
                   "base_url": list(getattr(engine.policy, "base_urls", _base_urls(args)))}
    options = _ray_options(args)
    limits = {"engine": None, "per_env": engine.config.per_env_concurrency,
              "replica_connections": getattr(engine.policy, "max_connections", None)}
    rollouts = RayRollouts(EvalEngineFactory(worker_args, engine.trust), options, max_concurrency=args.concurrency,
                           engine_limits=limits, trust=engine.trust)
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
    from gym_bridge.scale.ray_cluster import RayOptions

    return RayOptions(address=None if args.ray == "local" else args.ray, num_workers=args.ray_workers, max_retries=args.ray_max_retries,
                      connect_timeout_s=args.ray_connect_timeout_s)


async def _live_base_urls(urls: list[str], *, api_key: str | None, timeout_s: float) -> list[str]:
    """The replicas that answer `/models` now, when several are given (all of them when none answers: the
    caller then reports the first one's error); says which ones are left out."""
    if len(urls) < 2:
        return urls
    from gym_bridge.policies.discovery import served_models
    from gym_bridge.policies.router import live_replicas

    live, dead = await live_replicas(urls, lambda url: served_models(url, api_key=api_key, timeout_s=timeout_s))
    if not live:
        return urls
    for url, reason in dead.items():
        print(f"warning: replica {url} does not answer ({reason}); starting on the {len(live)} live one(s)", file=sys.stderr)
    return live
