"""recipes/trl_async_grpo.py end to end on the CPU: its CPU config (two optimizer steps, a tiny model) against the
vLLM stand-in, and both shipped configs building a valid AsyncGRPOConfig."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl.experimental.async_grpo", reason="needs TRL >= 1.16")

from gym_bridge.trl import load_recipe_config  # noqa: E402
from tests.support.vllm_async_stand_in import AsyncVLLMStandIn  # noqa: E402
from tests.support.http_server import app_in_thread  # noqa: E402
from tests.support.scripts import load_script

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "recipes" / "configs"


@pytest.fixture(scope="module")
def recipe():
    return load_script(REPO / "recipes" / "trl_async_grpo.py", "trl_async_grpo_recipe")


@pytest.mark.parametrize("name", ["trl_async_grpo_cpu.yaml", "trl_async_grpo_gpu.yaml"])
def test_shipped_configs_are_valid(recipe, name, tmp_path):
    from gym_bridge.trl._trainer_args import rows_per_version
    from gym_bridge.trl._async.seams import async_seams

    # use_cpu: the GPU config is checked on this machine, which has no GPU for its bf16
    config = recipe.load_recipe_config(str(CONFIGS / name), [f"async_grpo.output_dir={tmp_path}", "async_grpo.use_cpu=true"])
    args = async_seams().config(**config["async_grpo"])
    assert args.token_budget == 0 and rows_per_version(args) == args.per_device_train_batch_size
    assert config["weights"] in ("file", "nccl") and recipe.load_rows(config["datasets"], CONFIGS, seed=0)


def test_the_async_recipe_reads_exponent_floats_as_numbers(recipe, tmp_path):
    """Issue 37 item 5: the async recipe's own copy of the config loader read `--set async_grpo.learning_rate=1e-6`
    as the string '1e-6', which reached TRL; both recipes now load their config with gym_bridge.trl.load_recipe_config."""
    config = recipe.load_recipe_config(str(CONFIGS / "trl_async_grpo_cpu.yaml"), ["async_grpo.learning_rate=1e-6", "async_grpo.beta=4E-2"])
    assert config["async_grpo"]["learning_rate"] == 1e-6 and config["async_grpo"]["beta"] == 0.04
    assert recipe.load_recipe_config is load_recipe_config


def test_cpu_config_trains_against_a_stand_in_server(recipe, tmp_path, tiny_model_dir, smol_tokenizer, monkeypatch, capsys):
    stand_in = AsyncVLLMStandIn(smol_tokenizer)
    with app_in_thread(stand_in.app) as url:
        overrides = [f"model={tiny_model_dir}", f"server.url={url}", "server.launch=false", "server.served_model=stub",
                     f"async_grpo.output_dir={tmp_path}", "async_grpo.max_steps=2", "async_grpo.per_device_train_batch_size=4",
                     "async_grpo.max_completion_length=48"]
        argv = ["trl_async_grpo.py", "--config", str(CONFIGS / "trl_async_grpo_cpu.yaml")] + [f"--set={o}" for o in overrides]
        monkeypatch.setattr(sys, "argv", argv)
        recipe.main()
    out = capsys.readouterr().out
    assert "trained 2 steps" in out
    # one readable line per logged step (it printed a dict of about 60 keys)
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert [line.split(" | ")[0] for line in steps[:2]] == ["step 1/2", "step 2/2"], out
    assert all("{" not in line and "batch/" not in line for line in steps)
    assert len(stand_in.loaded) == 3  # the first sync and one per step, through FileWeightTransfer
    rows = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    trained = [row for row in rows if not row["failure_kind"]]
    assert len(trained) >= 8 and {row["env"] for row in rows} <= {"arithmetic", "weather"}
    assert all(row["metrics"]["consumed_version"] - row["metrics"]["policy_version_min"] <= 2 for row in trained)


def test_sbatch_serves_what_the_async_trainer_needs():
    import re
    import subprocess

    path = REPO / "slurm" / "trl_async_grpo.sbatch"
    subprocess.run(["bash", "-n", str(path)], check=True)
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    server = next(line for line in text.splitlines() if "vllm.entrypoints.openai.api_server" in line)
    for needed in ("VLLM_SERVER_DEV_MODE=1", '"${TRANSFER[@]}"', "--logprobs-mode processed_logprobs", "--served-model-name policy"):
        assert needed in server, needed
    # the transfer: TRL's NCCL engine on GPUs, gym_bridge's file receiver on CPU nodes
    assert "TRANSFER=(--weight-transfer-config '{\"backend\": \"nccl\"}')" in text
    assert "TRANSFER=(--worker-extension-cls gym_bridge.trl.FileWeightReceiver)" in text
    trainer = next(line for line in text.splitlines() if "recipes/trl_async_grpo.py" in line)
    assert "--set server.url=$VLLM_URL" in trainer and "--set server.launch=false" in trainer
