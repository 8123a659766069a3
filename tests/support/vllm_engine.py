"""How the real-vLLM tests build an engine and a server on the embedded model, the same on the CPU
build and on a GPU: float32 (vLLM would pick bfloat16 on the CPU), small (1 GiB of KV cache on the CPU, 30 % of a GPU), eager (no graph capture:
about 15 s to start instead of 60), engine in this process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MAX_MODEL_LEN = 1024
SERVED_NAME = "smol"
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
"""The CPU build's KV cache (GiB; its default claims most of the memory) and an engine in the caller's process."""


def on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def engine_kwargs() -> dict[str, Any]:
    """`vllm.LLM` settings for the tests: eager, small, processed log-probs (as TRL's colocate mode)."""
    for name, value in CPU_ENV.items():
        os.environ.setdefault(name, value)
    kwargs: dict[str, Any] = {"dtype": "float32", "enforce_eager": True, "max_model_len": MAX_MODEL_LEN, "seed": 0, "logprobs_mode": "processed_logprobs"}
    if on_gpu():
        kwargs["gpu_memory_utilization"] = 0.3
    return kwargs


def new_vllm_engine() -> Any:
    from vllm import LLM

    from gym_bridge.policies.embedded import embedded_model_path

    return LLM(model=str(embedded_model_path()), **engine_kwargs())


def close_vllm_engine(llm: Any) -> None:
    """Stop the engine's core and free its memory now rather than at exit (the suite goes on after it)."""
    import gc

    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()
    del llm
    gc.collect()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_vllm_server(log_path: Path, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    """`python -m vllm.entrypoints.openai.api_server` on the embedded model (the CPU build's package is named
    vllm-cpu, so the `vllm serve` entry point fails on its metadata); returns the process and base URL once
    `/v1/models` answers. Chunked prefill is off: with it, seeded sampling stops the CPU build's engine. Started as
    TRL 1.16 asks for server mode: dev mode and the NCCL weight-transfer engine."""
    from gym_bridge.policies.embedded import embedded_model_path

    port = free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(embedded_model_path()),
               "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(MAX_MODEL_LEN),
               "--dtype", "float32", "--enforce-eager", "--seed", "0", "--logprobs-mode", "processed_logprobs",
               "--weight-transfer-config", '{"backend": "nccl"}', *extra]
    if not on_gpu():
        command.append("--no-enable-chunked-prefill")
    else:
        command += ["--gpu-memory-utilization", "0.3"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_SERVER_DEV_MODE": "1"}
    log = log_path.open("wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    base_url = f"http://127.0.0.1:{port}/v1"
    _wait_until_serving(process, base_url, log_path, timeout_s=300.0)
    return process, base_url


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _wait_until_serving(process: subprocess.Popen[bytes], base_url: str, log_path: Path, *, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the vLLM server exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            if httpx.get(f"{base_url}/models", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    stop(process)
    raise RuntimeError(f"the vLLM server did not answer within {timeout_s:g} s:\n{log_path.read_text()[-3000:]}")
