"""recipes/trl_grpo.py's own logic, without training: config overrides, generated datasets, a new
records folder per run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gym_bridge.trl import compact_log_line, load_recipe_config, quiet_vllm_version_warning

from tests.support.scripts import load_script

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def recipe():
    return load_script(REPO / "recipes" / "trl_grpo.py", "trl_grpo_recipe")


def test_overrides_reach_nested_keys_and_list_items(recipe, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("datasets:\n  - {env: arithmetic, prepare: {split: train, size: 10, seed: 0}}\ngrpo: {max_steps: 5}\n")
    loaded = load_recipe_config(str(config), ["datasets.0.prepare.seed=7", "grpo.max_steps=2", "gym_bridge.max_turns=1"])
    assert loaded["datasets"][0]["prepare"]["seed"] == 7 and loaded["grpo"]["max_steps"] == 2 and loaded["gym_bridge"] == {"max_turns": 1}
    with pytest.raises(SystemExit, match="not an index of a list of 1"):
        load_recipe_config(str(config), ["datasets.3.weight=2"])
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        load_recipe_config(str(config), ["grpo.max_steps"])


def test_exponent_floats_are_numbers_in_the_file_and_in_overrides(recipe, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("grpo: {learning_rate: 1e-5, beta: 4E-2, output_dir: run1e5, tag: '1e-5'}\n")
    loaded = load_recipe_config(str(config), ["grpo.max_grad_norm=5e-1", "grpo.weight_decay=.5e-2"])
    assert loaded["grpo"] == {"learning_rate": 1e-5, "beta": 0.04, "output_dir": "run1e5", "tag": "1e-5",
                              "max_grad_norm": 0.5, "weight_decay": 0.005}


def test_a_prepare_entry_generates_its_rows_under_the_output_dir(recipe, tmp_path):
    paths, weights = recipe.dataset_sources([{"env": "arithmetic", "prepare": {"split": "train", "size": 12, "seed": 3}}],
                                            tmp_path, tmp_path / "out" / "data")
    assert weights is None and paths == [tmp_path / "out" / "data" / "arithmetic.train.seed3.jsonl"]
    rows = [json.loads(line) for line in paths[0].read_text().splitlines()]
    assert len(rows) == 12 and all(row["agent_ref"]["name"] == "arithmetic" for row in rows)


def test_every_run_gets_its_own_records_folder(recipe, tmp_path, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    first, second = recipe.run_directory(tmp_path / "rollouts"), recipe.run_directory(tmp_path / "rollouts")
    assert (first.name, second.name) == ("run-1", "run-2") and first.is_dir() and second.is_dir()
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit, match="no torch.distributed process group"):
        recipe.run_directory(tmp_path / "rollouts")  # ranks that cannot talk cannot agree on a folder
    assert sorted(p.name for p in (tmp_path / "rollouts").iterdir()) == ["run-1", "run-2"]


_RANK = """
import importlib.util, os, sys, time
import torch.distributed as dist
root, recipe_path, port, rank, world = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
spec = importlib.util.spec_from_file_location("r", recipe_path)
recipe = importlib.util.module_from_spec(spec); spec.loader.exec_module(recipe)
if world > 1:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
if rank == 0 and world > 1:
    time.sleep(1.0)  # rank 0 is the last to look: the other ranks must still join its folder
print(recipe.run_directory(__import__("pathlib").Path(root)))
if world > 1:
    dist.destroy_process_group()
"""


@pytest.mark.slow  # 8 processes importing torch: about 30 s on 2 shared cores
def test_ranks_of_concurrent_launches_agree_on_their_run_folder(tmp_path):
    """Two launches of 3 ranks each (real processes with a real gloo process group, as `accelerate launch`
    sets up; TORCHELASTIC_RUN_ID is `none` there) and two single-process runs start together on one
    records folder: each launch's ranks share one run-N, and no two launches share one."""
    import socket
    import subprocess
    import sys

    root = tmp_path / "rollouts"
    launches: list[list[subprocess.Popen[str]]] = []
    for world in (3, 3, 1, 1):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        env = {**__import__("os").environ, "TORCHELASTIC_RUN_ID": "none", "WORLD_SIZE": str(world), "MASTER_PORT": str(port)}
        launches.append([subprocess.Popen([sys.executable, "-c", _RANK, str(root), str(REPO / "recipes" / "trl_grpo.py"), str(port),
                                           str(rank), str(world)], env={**env, "RANK": str(rank)}, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True)
                         for rank in range(world)])
    folders = []
    for ranks in launches:
        outputs = [process.communicate(timeout=120) for process in ranks]
        assert all(process.returncode == 0 for process in ranks), [err[-2000:] for _, err in outputs]
        paths = {out.strip() for out, _ in outputs}
        assert len(paths) == 1, paths  # every rank of the launch writes into one folder
        folders.append(Path(paths.pop()).name)
    assert sorted(folders) == ["run-1", "run-2", "run-3", "run-4"]  # four launches, four folders
    assert sorted(p.name for p in root.iterdir()) == ["run-1", "run-2", "run-3", "run-4"]


def test_output_is_line_buffered_so_step_metrics_reach_a_log_file_as_they_happen(tmp_path):
    """Issue 19 item 18: with stdout redirected to a file, a step's metrics line is there while training goes on."""
    import subprocess
    import sys
    import time

    log = tmp_path / "train.log"
    code = ("import time\nimport gym_bridge.trl as r\n"
            "r.line_buffered_output()\nprint({'loss': 0.5, 'step': 1})\ntime.sleep(60)\n")
    with log.open("w") as handle:
        child = subprocess.Popen([sys.executable, "-c", code], stdout=handle)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and "'loss': 0.5" not in log.read_text():
                time.sleep(0.1)
            assert "'loss': 0.5" in log.read_text()
        finally:
            child.kill()
            child.wait()


def test_records_carry_their_training_step():
    from gym_bridge.core.record import with_train_step

    row = {"reward": 1.0, "metrics": {"turns": 2}}
    assert with_train_step(row, 7) == {"reward": 1.0, "metrics": {"turns": 2, "train_step": 7}}
    assert row == {"reward": 1.0, "metrics": {"turns": 2}}  # the record itself is not changed


GRPO_STEP_LOGS = {  # the keys TRL 1.16's GRPOTrainer logs at a step of the CPU demo (values made up)
    "loss": 0.0123, "grad_norm": 0.88, "learning_rate": 1e-05, "num_tokens": 20480.0, "completions/mean_length": 24.5,
    "completions/min_length": 3.0, "completions/max_length": 32.0, "completions/clipped_ratio": 0.25,
    "completions/mean_terminated_length": 20.1, "completions/min_terminated_length": 3.0, "completions/max_terminated_length": 31.0,
    "rewards/env_reward/mean": 0.41, "rewards/env_reward/std": 0.2, "reward": 0.41, "reward_std": 0.2, "frac_reward_zero_std": 0.5,
    "entropy": 0.81, "clip_ratio/low_mean": 0.0, "clip_ratio/low_min": 0.0, "clip_ratio/high_mean": 0.0, "clip_ratio/high_max": 0.0,
    "clip_ratio/region_mean": 0.0, "step_time": 29.4, "gym_bridge/failed": 0.0, "gym_bridge/tool_calls": 0.0,
    "gym_bridge/turns": 1.0, "gym_bridge/parse_errors": 0.0, "gym_bridge/no_answer": 0.0625, "gym_bridge/failed/infra": 0.0,
    "gym_bridge/arithmetic/tool_call_rate": 0.0, "epoch": 0.06,
}


def test_a_step_prints_as_one_compact_line(recipe):
    """Issue 28 item 18: each step printed a 40-key dict of strings."""
    line = compact_log_line(3, 30, GRPO_STEP_LOGS)
    assert line.startswith("step 3/30 | loss 0.0123 | reward 0.41 ± 0.2 | len 24.5 | entropy 0.81 | grad 0.88 | lr 1e-05 | s/step 29.4")
    assert line.endswith("gym_bridge: failed 0, tool_calls 0, turns 1, parse_errors 0, no_answer 0.0625")
    assert "{" not in line and "clip_ratio" not in line and len(line) < 200
    summary = compact_log_line(30, 30, {"train_runtime": 901.5, "train_loss": 0.01, "total_flos": 0.0})
    assert summary == "step 30/30 | train_runtime 902 | train_loss 0.01"


ASYNC_STEP_LOGS = {  # keys TRL 1.16's AsyncGRPOTrainer logs at a step of the async CPU recipe (values made up; 17 of ~60)
    "loss": 0.02, "grad_norm": 1.5, "learning_rate": 1e-05, "reward": 0.25, "reward_std": 0.4, "rewards/arithmetic": 0.25,
    "entropy": 0.9, "kl": 0.001, "clip_ratio/low_mean": 0.0, "perf/step_s": 12.5, "perf/rollout_wait_s": 3.1,
    "sample/staleness_mean": 1.0, "batch/packing_ratio": 0.7, "batch/pad_frac": 0.1, "gym_bridge/turns": 1.5,
    "gym_bridge/tool_calls": 0.5, "gym_bridge/staleness_max": 1.0, "epoch": 0.1,
}


def test_an_async_step_prints_as_one_compact_line():
    """Issue 36 item 18: the async recipe printed a raw dict of about 60 keys per step."""
    line = compact_log_line(2, 20, ASYNC_STEP_LOGS)
    assert line == ("step 2/20 | loss 0.02 | reward 0.25 ± 0.4 | entropy 0.9 | kl 0.001 | grad 1.5 | lr 1e-05 | s/step 12.5 | "
                    "gym_bridge: turns 1.5, tool_calls 0.5, staleness_max 1")


def test_trls_vllm_version_warning_is_silent_without_vllm(tmp_path):
    """Issue 28 item 18: five identical warnings about vLLM's version in a run that does not use vLLM."""
    import os
    import subprocess
    import sys

    script = ("import sys\nimport gym_bridge.trl\n"
              "gym_bridge.trl.quiet_vllm_version_warning(use_vllm=sys.argv[1] == 'vllm')\n"
              "from trl import GRPOConfig, GRPOTrainer\nimport gym_bridge.trl\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", script, "no-vllm"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "TRL currently supports vLLM versions" not in done.stderr


def test_the_vllm_version_warning_is_shown_once_when_vllm_is_used():
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.resetwarnings()
        warnings.onceregistry.clear()
        quiet_vllm_version_warning(use_vllm=True)
        for _ in range(2):
            warnings.warn("TRL currently supports vLLM versions from 0.22.0 to 0.31.0. You have version 0.32.0", UserWarning)
        warnings.warn("TRL currently supports vLLM versions from 0.22.0 to 0.31.0. You have version 0.32.0", UserWarning)
    assert len(seen) == 1


def test_the_cpu_demo_saves_checkpoints_along_the_way():
    """Issue 36 item 18: the CPU demo saved weights only at the end (a run stopped at step 26 of 30 kept nothing)."""
    grpo = load_recipe_config(REPO / "recipes" / "configs" / "trl_grpo_cpu_demo.yaml", [])["grpo"]
    assert grpo["save_strategy"] == "steps" and grpo["save_steps"] <= grpo["max_steps"] // 3 and grpo["save_total_limit"] == 1


def test_the_cpu_demo_keeps_its_trained_weights():
    """Issue 28 item 18: the CPU recipe saved no model (the recipe prints where it saves; the slow recipe test trains)."""
    config = (REPO / "recipes" / "configs" / "trl_grpo_cpu_demo.yaml").read_text()
    assert "\nsave_model: true" in config
    source = (REPO / "recipes" / "trl_grpo.py").read_text()
    assert "trained model saved to {output_dir}" in source and "--set save_model=true keeps them" in source
