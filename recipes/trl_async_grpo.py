"""Asynchronous GRPO with TRL's AsyncGRPOTrainer and gym_bridge's rollout worker: generation never waits for the trainer.

    # a laptop: the embedded SmolLM2-135M-Instruct trained on the CPU against a vLLM CPU server this script starts
    python recipes/trl_async_grpo.py --config recipes/configs/trl_async_grpo_cpu.yaml
    # one node: vLLM on GPU 1 (started by you, see the GPU config's header), the trainer on GPU 0
    CUDA_VISIBLE_DEVICES=0 python recipes/trl_async_grpo.py --config recipes/configs/trl_async_grpo_gpu.yaml
    # several nodes: slurm/trl_async_grpo.sbatch
    # any config value can be overridden: --set async_grpo.max_steps=5 --set server.url=http://host:8000

The YAML config:
  model        a local folder or hub id (null: the embedded SmolLM2-135M-Instruct); the server serves the same
  server       url, served_model (the server's model name), launch (true: start a vLLM CPU server here for
               the run, with FileWeightReceiver; false: one you started is used)
  datasets     a list of {env: NAME} (its example data) or {path: FILE.jsonl}; rows are mixed and shuffled
  async_grpo   AsyncGRPOConfig fields (num_generations, max_staleness, weight_sync_steps, token_budget: 0, ...)
  gym_bridge   worker settings: max_turns, max_completion_tokens (all turns), max_concurrency, deadline_s,
               records (true: every rollout's record, with its per-call policy versions and the trainer's
               version when it was consumed, to `<output_dir>/rollouts.jsonl`), journal (true, the default: each
               finished turn of the rollouts in flight to `<output_dir>/rollout_journal/`, so a restarted run
               continues them from their last turn, keeping their turns' policy versions; false: off),
               end_of_run (true, the default: stop starting groups once they cover the rows the trainer will take
               by max_steps, so every episode started is trained; false: keep generating to the last step)
  resume_from_checkpoint  a checkpoint folder, or true for the latest whole one under output_dir (one a kill
               cut off while it was being saved is skipped): passed to `trainer.train`. Each checkpoint also holds the worker's progress (which groups the trainer took,
               the policy version), so the restarted run goes on counting versions and groups from there; with
               `gym_bridge.journal`, the groups not yet covered by the checkpoint (in flight, or pushed or taken
               after it) continue from their last turn, keeping their turns' policy versions
  weights      `file`: FileWeightTransfer (a file and /collective_rpc; CPU servers, or any server on the same
               filesystem); `nccl`: TRL's own transfer (CUDA servers started with the NCCL weight-transfer engine)
  cpu          true: train on the CPU (AsyncGRPOTrainer's CUDA-only tree attention gets its PyTorch stand-in)

Each logging step prints one line (`gym_bridge.trl.compact_log_line`: loss, reward, entropy, ..., gym_bridge's
rollout metrics); every logged value stays in the trainer's log history (`trainer_state.json` in checkpoints).
The worker (gym_bridge.trl.AsyncRolloutWorker) runs each row's environment, scores with its verifier, computes
group advantages over the scored rollouts, and starts a group only when its rows will still be within
`max_staleness` when the trainer takes them; a rollout that fails is counted and left out, never a crash.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gym_bridge.trl import line_buffered_output, load_recipe_config, quiet_vllm_version_warning, use_compact_log


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="YAML config (see recipes/configs/trl_async_grpo_*.yaml)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. async_grpo.max_steps=5 (VALUE is read as YAML)")
    return parser.parse_args()


def load_rows(entries: list[dict[str, Any]], config_dir: Path, seed: int) -> list[Any]:
    """The tasks of every `datasets` entry, shuffled with `seed` (each keeps its file and line for errors)."""
    import gym_bridge
    from gym_bridge.core.task import load_tasks, parse_task

    tasks = []
    for entry in entries:
        if "env" in entry:
            [path] = gym_bridge.trl.example_data_paths([entry["env"]])
        else:
            path = Path(entry["path"])
            path = config_dir / path if not path.is_absolute() and (config_dir / path).exists() else path
        tasks += load_tasks(path)
    random.Random(seed).shuffle(tasks)
    return [parse_task(task.row, index=index, source=task.source) for index, task in enumerate(tasks)]


def launch_cpu_server(model: str, served_model: str, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    """A vLLM CPU server on `model` that loads weights through FileWeightReceiver (dev mode on); returns once it answers."""
    import httpx

    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", served_model,
               "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager", "--max-model-len", "2048",
               "--logprobs-mode", "processed_logprobs", "--no-enable-chunked-prefill",
               "--worker-extension-cls", "gym_bridge.trl.FileWeightReceiver"]
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(command, stdout=log_path.open("wb"), stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the vLLM server exited with {process.returncode}; see {log_path}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(2)
    process.terminate()
    raise SystemExit(f"the vLLM server did not answer within 600 s; see {log_path}")


def run(config: dict[str, Any], config_dir: Path) -> tuple[Any, Any]:
    """Train as `config` says (the server started first when `server.launch`); returns the trainer and its worker."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

    from datasets import Dataset
    from transformers import AutoTokenizer

    import gym_bridge
    from gym_bridge.trl import FileWeightTransfer, async_seams, cpu_async_grpo_trainer, restore_async_worker, worker_checkpoint_callback

    model = config.get("model")
    if model is None:
        from gym_bridge.policies.embedded import embedded_model_path

        model = str(embedded_model_path())
    seams = async_seams()
    server = dict(config.get("server") or {})
    url = str(server.get("url", "http://127.0.0.1:8000")).rstrip("/")
    grpo_args = seams.config(**{**(config.get("async_grpo") or {}), "vllm_server_base_url": url})
    output_dir = Path(grpo_args.output_dir)
    tasks = load_rows(config.get("datasets") or [], config_dir, int(grpo_args.seed))
    tokenizer = AutoTokenizer.from_pretrained(model)
    process = None
    if server.get("launch"):
        process = launch_cpu_server(model, str(server.get("served_model", "policy")), int(url.rsplit(":", 1)[1]), output_dir / "vllm_server.log")
    try:
        options = dict(config.get("gym_bridge") or {})
        records = options.pop("records", True)
        journal = options.pop("journal", True)
        worker = gym_bridge.trl.AsyncRolloutWorker.for_trainer(
            grpo_args, tasks=tasks, tokenizer=tokenizer, served_model=str(server.get("served_model", "policy")),
            num_processes=int(os.environ.get("WORLD_SIZE", "1")),
            records_path=output_dir / "rollouts.jsonl" if records else None,
            journal_dir=output_dir / "rollout_journal" if journal else False, **options)
        # the weights file goes under output_dir, which a server on another node sees on a shared file system
        transfer = FileWeightTransfer(url, directory=output_dir / "weights") if config.get("weights", "file") == "file" else None
        build = cpu_async_grpo_trainer if config.get("cpu") else seams.trainer
        # the worker brings its own rows; the trainer's dataset only sizes its epoch bookkeeping (max_steps rules)
        trainer = build(model=model, args=grpo_args, processing_class=tokenizer, rollout_worker=worker, weight_transfer=transfer,
                        train_dataset=Dataset.from_dict({"prompt": [""] * len(tasks)}))
        if grpo_args.save_strategy != "no":  # each checkpoint holds the worker's groups and policy version
            trainer.add_callback(worker_checkpoint_callback(worker))
        use_compact_log(trainer)
        checkpoint = restore_async_worker(trainer, worker, config.get("resume_from_checkpoint"))
        trainer.train(resume_from_checkpoint=checkpoint)
        print(f"trained {trainer.state.global_step} steps; worker: {dict(worker.counts)}", flush=True)
        return trainer, worker
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=60)


def main() -> None:
    line_buffered_output()
    args = parse_args()
    quiet_vllm_version_warning(use_vllm=True)  # the trainer and the worker both ask TRL about vLLM: one warning, not two
    run(load_recipe_config(args.config, args.set), Path(args.config).parent)


if __name__ == "__main__":
    main()
