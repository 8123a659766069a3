"""The recipe's DeepSpeed configs on two CPU ranks (DeepSpeed's CPU accelerator, gloo plus its shared-memory
op, which DeepSpeed compiles with the C++ compiler on first use): `accelerate_zero2.yaml` trains a step;
`accelerate_zero3.yaml` is refused with gym_bridge's clear error, since generating with the trainer's
model under ZeRO-3 needs vLLM (not installed with DeepSpeed here). `make install-deepspeed` installs it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed", reason="needs DeepSpeed: make install-deepspeed")
pytestmark = [pytest.mark.slow, pytest.mark.integration]

ROOT = Path(__file__).parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch(accelerate_config: str, output: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    """`accelerate launch` of the recipe on 2 CPU processes: the CPU demo cut to one step of 2 groups of 4."""
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", f"recipes/configs/{accelerate_config}",
        "--num_processes", "2", "--mixed_precision", "no", "--main_process_port", str(free_port()),
        "recipes/trl_grpo.py", "--config", "recipes/configs/trl_grpo_cpu_demo.yaml",
        "--set", "grpo.max_steps=1", "--set", "grpo.num_generations=4", "--set", "grpo.per_device_train_batch_size=4",
        "--set", "grpo.gradient_accumulation_steps=1", "--set", "grpo.max_completion_length=32",
        "--set", f"grpo.output_dir={output}", "--set", "gym_bridge.records_dir=null", *overrides,
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)


def test_zero2_trains_a_step_on_two_cpu_ranks(tmp_path):
    done = launch("accelerate_zero2.yaml", tmp_path, "--set", "grpo.save_strategy=steps", "--set", "grpo.save_steps=1")
    assert done.returncode == 0, done.stderr[-4000:]
    assert "'train_loss'" in done.stdout + done.stderr
    step = tmp_path / "checkpoint-1"
    # DeepSpeed's own checkpoint, optimizer state partitioned across the two ranks (ZeRO stage 2)
    shards = sorted(path.name for path in step.glob("global_step1/*optim_states.pt"))
    assert shards == ["zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"], sorted(
        str(path.relative_to(tmp_path)) for path in step.rglob("*"))


def test_zero3_without_vllm_is_refused_with_the_reason(tmp_path):
    done = launch("accelerate_zero3.yaml", tmp_path)
    assert done.returncode != 0
    assert "under DeepSpeed ZeRO-3 makes transformers synchronise every decoding step" in done.stderr
    assert "use vLLM (use_vllm=True) or ZeRO-2" in done.stderr
