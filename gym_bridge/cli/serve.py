"""`gym-bridge serve-model` (a transformers model over an OpenAI-compatible HTTP API, `gym_bridge.serve.model_server`)
and `gym-bridge serve` (environments as NeMo Gym agent servers for NeMo RL,
`gym_bridge.serve.agent_server`, started by `gym_bridge.serve.agent_launch`): their options and start-up checks.

The two names stay as they are (issue 29 weighed a rename and kept them, the cheap option): `serve` is what NeMo RL
recipes and scripts already run, and each command's help line says what it serves (a model, or environments).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Literal

from gym_bridge.cli.common import (EMBEDDED_MODEL_NAME, _load_average, check_hosts_resolve, check_local_model, check_urls,
                                   model_flag_errors, torch_threads)
from gym_bridge.core.errors import ConfigError, MissingExtraError


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
    p.add_argument("--max-concurrency", type=int, default=1024,
                   help="requests in flight at once; past it a request gets a 503 with Retry-After (/health is always answered)")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads of one generation (default: torch's, or 1 when the machine is already busier than "
                        "its cores: threads that wait for each other then made generation 10-20x slower)")
    p.set_defaults(func=_serve_model)


def _serve_model(args: argparse.Namespace) -> int:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise MissingExtraError("serve-model needs FastAPI and uvicorn: pip install 'gym-bridge[serve]'") from None
    from gym_bridge.serve.listen import bind_socket
    from gym_bridge.serve.model_server import serve

    if args.max_concurrency < 1:
        raise ConfigError(f"--max-concurrency must be at least 1, got {args.max_concurrency}")
    check_local_model(args.model)  # as eval says it, before the port is taken and the model loads
    sock = bind_socket(args.host, args.port)  # a busy port fails now, not after the model has loaded
    from gym_bridge.policies.factory import PolicySpec, build_policy
    from gym_bridge.policies.transformers import TransformersPolicy, cpu_threads

    threads = cpu_threads(torch_threads(args.threads, default=cpu_threads(), cores=os.cpu_count() or 1, load=_load_average()))
    print(f"serve-model: {threads} CPU thread{'s' if threads > 1 else ''} per generation (--threads N to change)", file=sys.stderr, flush=True)

    spec = PolicySpec(kind="transformers", model=args.model, device=args.device, max_batch_size=args.max_batch_size,
                      batch_wait_s=args.batch_wait_s, max_batch_tokens=args.max_batch_tokens,
                      release_memory_above_tokens=args.release_memory_above_tokens)
    policy = model_flag_errors(args.model, build_policy, spec)
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
          max_request_bytes=args.max_request_bytes, max_requests=args.max_concurrency, on_ready=ready, sock=sock)
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
    p.add_argument("--max-concurrency", type=int, default=None,
                   help="rollouts in flight at once (default 1024); past it a /run gets a 503 with Retry-After (/health is always answered)")
    p.add_argument("--max-request-bytes", type=int, default=None, help="larger /run bodies get a 413 (default 16 MiB)")
    p.add_argument("--request-timeout-s", type=float, default=None, help="timeout of one model call (default 600)")
    journal = p.add_mutually_exclusive_group()
    journal.add_argument("--journal", default=None, metavar="DIR",
                         help="commit each finished turn of the rows that name their rollout (_ng_task_index, _ng_rollout_index) "
                              "to DIR, so the same rollout sent again (a retry, a restarted server) continues from its last turn; "
                              "a restart against another model (its name, root and tokenizer, as the model servers report "
                              "them at start) or other settings is refused. Default: on, in ~/.cache/gym_bridge/serve_journal/"
                              "port-PORT (off with --port 0)")
    journal.add_argument("--no-journal", action="store_true", help="journal nothing (a rollout sent again starts from turn 0)")
    p.add_argument("--api-key-env", default=None, metavar="VAR", help="environment variable holding the model server's API key")
    p.set_defaults(func=_agent_serve)


def _agent_serve(args: argparse.Namespace) -> int:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise MissingExtraError("gym-bridge serve needs FastAPI and uvicorn: pip install 'gym-bridge[serve]'") from None
    from gym_bridge.serve.agent_launch import default_journal_dir, serve, settings_from_args

    urls = [url.strip() for entry in args.model_base_url for url in entry.split(",") if url.strip()]
    check_urls(urls, flag="--model-base-url")
    check_hosts_resolve(urls, flag="--model-base-url")
    settings = settings_from_args(
        args.env, args.model_base_url, model=args.model, max_turns=args.max_turns, max_new_tokens=args.max_new_tokens,
        max_completion_tokens=args.max_completion_tokens, deadline_s=args.deadline_s, max_concurrency=args.max_concurrency,
        max_request_bytes=args.max_request_bytes, request_timeout_s=args.request_timeout_s,
        api_key=os.environ.get(args.api_key_env) if args.api_key_env else None,
        journal_dir=None if args.no_journal else args.journal or default_journal_dir(args.port),
    )
    serve(settings, host=args.host, port=args.port, on_ready=lambda url: print(f"serving {', '.join(settings.envs)} at {url}", flush=True))
    return 0
