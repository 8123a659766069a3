"""TRL 1.16 with the real vLLM engine (the CPU build here, CUDA on a GPU) and the embedded SmolLM2.

Colocate: `GRPOTrainer(use_vllm=True, vllm_mode="colocate", rollout_func=gym_bridge.trl.rollout)` trains
two steps; the weights TRL pushes into the engine after each step are checked to be the trained ones.
On the CPU build two things are changed in this process only, each named where it is done: vLLM's
linear layers keep their weights (the build repacks them for oneDNN/AMX and drops the parameters
TRL's weight sync loads into), and the engine starts eager (no graph capture: about 15 s, not 60).
Sleep mode: the CPU build refuses it ("not supported on current platform"), so it runs only on a GPU.

This file is also the colocate worker: `python tests/trl/test_vllm.py OUT_DIR`.

Server: TRL 1.16 syncs weights to a `vllm serve --weight-transfer-config '{"backend": "nccl"}'` server
over NCCL, which needs CUDA; on the CPU the trainer refuses to start (asserted below). The rollouts of
server mode run for real against the session's vLLM server: every rank calls it over HTTP.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.invariants import assert_token_invariants
from tests.support.vllm_engine import CPU_ENV, MAX_MODEL_LEN, SERVED_NAME, on_gpu

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(600)]  # an engine starts in 15-60 s on 2 busy cores
if __name__ != "__main__":
    pytest.importorskip("vllm", reason="needs vLLM (make install puts its CPU build in the suite's virtualenv)")


def keep_linear_weights_on_the_cpu(monkeypatch):
    """vLLM's CPU build replaces each linear layer's weight with a packed copy for oneDNN/AMX (an empty
    `Parameter` without `weight_loader` is left behind, so TRL's `load_weights` fails); keep plain
    `F.linear` on the real weight instead, so weight updates reach the forward pass."""
    import torch.nn.functional as F
    from vllm.model_executor.layers import utils

    def plain(layer, remove_weight):
        layer.cpu_linear = lambda x, weight, bias: F.linear(x, weight, bias)

    monkeypatch.setattr(utils, "dispatch_cpu_unquantized_gemm", plain)


def eager_engine(monkeypatch):
    """TRL builds its `vllm.LLM` without `enforce_eager`; add it (and float32, the trainer's dtype)."""
    import trl.generation.vllm_generation as generation
    from vllm import LLM

    def build(*args, **kwargs):
        return LLM(*args, **{**kwargs, "enforce_eager": True, "dtype": "float32"})

    monkeypatch.setattr(generation, "LLM", build)


def grpo_dataset():
    import gym_bridge
    from gym_bridge.core.task import iter_jsonl

    [path] = gym_bridge.trl.example_data_paths(["arithmetic"])
    return gym_bridge.trl.load_dataset([[row for _, row in iter_jsonl(path)][:2]])


def train_colocate(output_dir: str) -> dict:
    """Two GRPO steps with TRL's colocated engine; returns what the test checks. Runs in its own process:
    TRL sets RANK/WORLD_SIZE and starts a process group for vLLM's external launcher, which must not leak
    into the rest of the suite."""
    import os

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    import gym_bridge
    from gym_bridge.policies.embedded import embedded_model_path

    for name, value in {**CPU_ENV, "TRL_EXPERIMENTAL_SILENCE": "1"}.items():
        os.environ.setdefault(name, value)
    with pytest.MonkeyPatch.context() as monkeypatch:
        if not on_gpu():
            keep_linear_weights_on_the_cpu(monkeypatch)
        eager_engine(monkeypatch)
        path = str(embedded_model_path())
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        records = []
        rollout = gym_bridge.trl.make_rollout(max_turns=1, on_records=records.extend)
        args = GRPOConfig(
            output_dir=output_dir, use_cpu=not on_gpu(), use_vllm=True, vllm_mode="colocate", vllm_max_model_length=MAX_MODEL_LEN,
            vllm_gpu_memory_utilization=0.3, vllm_enable_sleep_mode=on_gpu(), per_device_train_batch_size=4, num_generations=4,
            max_completion_length=24, max_steps=2, learning_rate=1e-3, temperature=1.0, beta=0.0, save_strategy="no",
            logging_steps=1, report_to="none", bf16=False, seed=0,
        )
        trainer = GRPOTrainer(model=model, reward_funcs=gym_bridge.trl.env_reward, args=args, train_dataset=grpo_dataset(),
                              processing_class=AutoTokenizer.from_pretrained(path), rollout_func=rollout)
        backend = rollout.prepare(trainer).backend
        before = {name: param.detach().clone() for name, param in model.named_parameters()}
        trainer.train()
        engine_model = trainer.vllm_generation.llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
        served = dict(engine_model.named_parameters())
        name = "model.layers.0.self_attn.o_proj.weight"
        return {
            "backend": backend,
            "records": [record.to_dict() for record in records],
            "changed": [key for key, param in model.named_parameters() if not torch.equal(before[key], param.detach())],
            "engine_weight_synced": not torch.allclose(served[name].float(), before[name].float()),
            "log": [entry for entry in trainer.state.log_history if "loss" in entry],
        }


def test_grpo_colocate_trains_with_the_real_engine(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, __file__, str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["backend"] == "vllm_colocate"
    records = result["records"]
    assert len(records) == 8 and all(record["failure_kind"] is None for record in records), [r["failure_reason"] for r in records]
    for record in records:
        assert_token_invariants(record)
    assert "model.layers.0.self_attn.o_proj.weight" in result["changed"], "two steps changed no attention weight"
    # TRL pushed the trained weights into the engine before the second step's generation
    assert result["engine_weight_synced"]
    assert len(result["log"]) == 2 and all("rewards/env_reward/mean" in entry for entry in result["log"])


@pytest.mark.skipif(on_gpu(), reason="on a GPU the colocate test runs with sleep mode")
def test_sleep_mode_is_refused_by_the_cpu_build():
    """`GRPOConfig(vllm_enable_sleep_mode=True)` reaches `vllm.LLM(enable_sleep_mode=True)`, which the CPU build refuses."""
    from vllm import LLM

    from gym_bridge.policies.embedded import embedded_model_path
    from tests.support.vllm_engine import engine_kwargs

    with pytest.raises(ValueError, match="Sleep mode is not supported on current platform"):
        LLM(model=str(embedded_model_path()), enable_sleep_mode=True, **engine_kwargs())


@pytest.mark.slow  # about 17 s; by default: eval against the same server (test_vllm_server.py), server-mode setup (test_rollout.py)
def test_server_mode_rollouts_against_a_real_vllm_server(vllm_server, smol_tokenizer):
    """What server mode runs per rank: `rollout(prompts, trainer)` calls the server over HTTP (processed log-probs)."""
    from types import SimpleNamespace

    import gym_bridge

    class Trainer:  # TRL's GRPOTrainer as the rollout function sees it in server mode (weak-referenceable)
        def __init__(self, **fields):
            self.__dict__.update(fields)

    _, base_url = vllm_server
    dataset = grpo_dataset()
    args = SimpleNamespace(vllm_mode="server", vllm_server_base_url=base_url.removesuffix("/v1"), vllm_tensor_parallel_size=1,
                           max_completion_length=24, temperature=1.0, top_p=1.0, top_k=0, num_generations=2)
    trainer = Trainer(args=args, use_vllm=True, processing_class=smol_tokenizer, train_dataset=dataset, eval_dataset=None,
                              model=SimpleNamespace(training=True, config=SimpleNamespace(_name_or_path="smol")), num_generations=2,
                              accelerator=SimpleNamespace(process_index=0, wait_for_everyone=lambda: None), tools=None,
                              environment_factories=None)
    records = []
    rollout = gym_bridge.trl.make_rollout(max_turns=1, server_request_timeout_s=60.0, on_records=records.extend)
    prompts = [prompt for prompt in dataset["prompt"] for _ in range(2)]
    rows = rollout(prompts, trainer)
    state = rollout.prepare(trainer)
    assert state.backend == "vllm_server" and state.engine.policy.model == SERVED_NAME
    assert state.engine.policy.request_timeout_s == 60.0
    assert len(rows["completion_ids"]) == 4 and all(kind is None for kind in rows["failure_kind"]), [r.failure_reason for r in records]
    for record, logprobs in zip(records, rows["logprobs"]):
        assert_token_invariants(record.to_dict())
        assert len(logprobs) >= 1 and all(lp <= 0.0 for lp in logprobs)


@pytest.mark.skipif(on_gpu(), reason="on a GPU TRL's server mode syncs weights over NCCL")
def test_grpo_server_mode_weight_sync_needs_cuda(vllm_server, tmp_path):
    """TRL refuses server mode on the CPU: its weight sync is vLLM's NCCL weight-transfer engine."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    import gym_bridge
    from gym_bridge.policies.embedded import embedded_model_path

    _, base_url = vllm_server
    path = str(embedded_model_path())
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, use_vllm=True, vllm_mode="server", vllm_server_base_url=base_url.removesuffix("/v1"),
                      per_device_train_batch_size=2, num_generations=2, max_completion_length=16, max_steps=1, report_to="none", bf16=False)
    with pytest.raises(NotImplementedError, match="NCCL weight-transfer engine, which needs a CUDA device"):
        GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(path), reward_funcs=gym_bridge.trl.env_reward, args=args,
                    train_dataset=grpo_dataset(), processing_class=AutoTokenizer.from_pretrained(path), rollout_func=gym_bridge.trl.rollout)


if __name__ == "__main__":
    out = Path(sys.argv[1])
    (out / "result.json").write_text(json.dumps(train_colocate(str(out))))
