"""GRPO with TRL on gym_bridge environments: multi-turn, tool-calling, several environments mixed.

    # one GPU, vLLM colocated in the training process
    accelerate launch --config_file recipes/configs/accelerate_single_gpu_colocate.yaml \
        recipes/trl_grpo.py --config recipes/configs/trl_grpo_mixed.yaml
    # several GPUs with DeepSpeed (ZeRO-2 or ZeRO-3); see slurm/trl_grpo.sbatch for several nodes
    accelerate launch --config_file recipes/configs/accelerate_zero2.yaml --num_processes 8 \
        recipes/trl_grpo.py --config recipes/configs/trl_grpo_math.yaml
    # a laptop: the embedded SmolLM2-135M-Instruct on the CPU
    python recipes/trl_grpo.py --config recipes/configs/trl_grpo_cpu_demo.yaml
    # any config value can be overridden: --set grpo.max_steps=5 --set model=/path/to/model

The YAML config has these parts:
  model      a local folder or hub id (null: the embedded SmolLM2-135M-Instruct)
  datasets   a list of {path: FILE.jsonl}, {env: NAME} (its example data) or
             {env: NAME, prepare: {split, size, seed}} (rows from its generator), each with a `weight`
  dataset    options of gym_bridge.trl.load_dataset (num_rows, seed, limit)
  grpo       GRPOConfig fields, `report_to`, `use_vllm` and `vllm_mode` included
  gym_bridge gym_bridge.trl.make_rollout options (max_turns, deadline_s, ...), plus `records_dir`
             and `generation_server` ({base_url, model}: generate with that OpenAI-compatible server
             while TRL trains its own copy, `grpo.use_vllm: false`; no weights reach the server, so
             after the first step the rollouts come from the initial policy: off-policy, for a trainer
             that cannot sync weights, e.g. TRL's server mode on a CPU)
             (default `rollouts`, under grpo.output_dir; null: none): every rollout record as
             JSONL, one file per rank, in a new `run-N` folder per run, each record with the
             training step it was generated at (`metrics.train_step`)
             `journal: true` commits each finished turn of the batch in flight to
             `grpo.output_dir/rollout_journal/`, so a run resumed from its checkpoint continues that batch's
             episodes from their last turn (worth it with a checkpoint each step: `grpo.save_steps: 1`);
             a run that ends normally removes it
  peft       optional LoRA settings (peft.LoraConfig fields; needs `pip install peft`)
  save_model true: the trained weights (and tokenizer) are saved to grpo.output_dir at the end
  resume_from_checkpoint  a checkpoint folder, or true for the latest under grpo.output_dir (`trainer.train`'s)

The rollout function runs each task's environment and tools itself and enforces
`max_completion_length` over all turns; the reward is the environment's verifier
(gym_bridge.trl.env_reward). Everything runs under main(): the math verifier's worker processes
re-import this script, so its top level stays cheap. Output is line-buffered, so per-step metrics
reach a log file as they happen, one compact line per logging step (`compact_log_line`: loss, reward,
lengths, gym_bridge's rollout metrics); every logged value is in `log_history.json`, kept in each
run's `run-N` folder (`grpo.output_dir/log_history.json` is the latest run's copy). TRL's warning
about the installed vLLM's version is shown once, and not at all when the run does not use vLLM.
"""

from __future__ import annotations

import argparse
import json
import os
import warnings
from pathlib import Path
from typing import Any

from gym_bridge.trl import line_buffered_output, load_recipe_config, quiet_vllm_version_warning, use_compact_log


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="YAML config (see recipes/configs/)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. grpo.max_steps=5 (VALUE is read as YAML)")
    return parser.parse_args()


def dataset_sources(entries: list[dict[str, Any]], config_dir: Path, work_dir: Path) -> tuple[list[Path], list[float] | None]:
    """Paths and weights of the `datasets` entries (None when no entry has a weight: the files are
    concatenated as they are); relative paths are relative to the config, then to the cwd.
    `{env: NAME, prepare: {split, size, seed, task, ...}}` generates rows with the environment's
    `prepare_rows` into `work_dir`."""
    import gym_bridge
    from gym_bridge.data import prepare, write_rows

    paths, weights = [], []
    for entry in entries:
        if "prepare" in entry:
            options = dict(entry["prepare"])
            rows = prepare(entry["env"], **options)
            task = f".{options['task']}" if options.get("task") else ""  # two tasks of one environment: two files
            name = f"{entry['env']}{task}.{options.get('split', 'train')}.seed{options.get('seed', 0)}.jsonl"
            path = write_rows(rows, work_dir / name)
        elif "env" in entry:
            [path] = gym_bridge.trl.example_data_paths([entry["env"]])
        else:
            path = Path(entry["path"])
            if not path.is_absolute() and (config_dir / path).exists():
                path = config_dir / path
        paths.append(path)
        weights.append(float(entry.get("weight", 1.0)))
    return paths, weights if any("weight" in entry for entry in entries) else None


def run_directory(records_root: Path) -> Path:
    """`records_root/run-N` for the first N not taken: a run never overwrites an earlier run's records.

    Rank 0 claims N by creating the folder (mkdir is atomic: two launches at once get different N) and
    sends its name to the other ranks over the launch's process group (torch.distributed, which
    `GRPOConfig.device` sets up under `accelerate launch` or torchrun), so every rank of one launch
    writes into the same folder whatever order they start in. Raises SystemExit for a launch of
    several processes (WORLD_SIZE > 1) whose process group is not set up yet.
    """
    import torch.distributed as dist

    shared = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    if not shared and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise SystemExit("run_directory: WORLD_SIZE > 1 but no torch.distributed process group; set it up first (GRPOConfig.device)")
    name: list[str | None] = [_claim_run(records_root) if not shared or dist.get_rank() == 0 else None]
    if shared:
        dist.broadcast_object_list(name, src=0)
    path = records_root / str(name[0])
    path.mkdir(parents=True, exist_ok=True)  # a node that does not share rank 0's filesystem
    return path


def check_world_size(expected: str | None) -> None:
    """Stop unless this launch's process group has `expected` processes (GYM_BRIDGE_WORLD_SIZE, set by
    slurm/trl_grpo.sbatch): an accelerate config that is not distributed starts every process as a training
    of its own (world size 1, all writing one output_dir) without an error. Prints this rank's place."""
    import torch.distributed as dist

    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    print(f"gym_bridge: rank {rank} of {world}", flush=True)
    if expected is not None and world != int(expected):
        raise SystemExit(f"gym_bridge: world size {world}, expected {expected} (GYM_BRIDGE_WORLD_SIZE): the processes "
                         "are not one distributed job; check the accelerate config's distributed_type and the launch")


def frozen_server_policy(server: dict[str, Any], *, use_vllm: bool) -> Any:
    """The remote policy of `gym_bridge.generation_server` ({base_url, model}); TRL's own vLLM must be off,
    as its server mode would generate and push weights too. Prints that the server's weights stay frozen."""
    from gym_bridge.policies.factory import PolicySpec, build_policy

    if use_vllm or not isinstance(server, dict) or not server.get("base_url"):
        raise SystemExit("gym_bridge.generation_server needs {base_url: URL, model: NAME} and grpo.use_vllm: false")
    print(f"gym_bridge: generation from {server['base_url']}; no weights are sent there, so its rollouts stay those "
          "of the initial policy (off-policy after the first step)", flush=True)
    return build_policy(PolicySpec(kind="remote", model=server.get("model"), base_urls=(str(server["base_url"]),)))


def _claim_run(records_root: Path) -> str:
    """Create `records_root/run-N` for the first N above those taken; returns its name."""
    records_root.mkdir(parents=True, exist_ok=True)
    taken = [int(p.name.removeprefix("run-")) for p in records_root.glob("run-*") if p.name.removeprefix("run-").isdigit()]
    number = max(taken, default=0) + 1
    while True:
        try:
            (records_root / f"run-{number}").mkdir()
            return f"run-{number}"
        except FileExistsError:  # another launch took it between the listing and the mkdir
            number += 1


def main() -> None:
    line_buffered_output()
    args = parse_args()
    config = load_recipe_config(args.config, args.set)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in TRL 1.16
    # TRL 1.16 still calls transformers 5's deprecated gradient_checkpointing* methods around generation;
    # the names are TRL's to change, and the warning tells a user of this recipe nothing they can act on.
    warnings.filterwarnings("ignore", message=r"`(is_)?gradient_checkpointing\w*` is deprecated", category=FutureWarning)
    quiet_vllm_version_warning(use_vllm=bool((config.get("grpo") or {}).get("use_vllm", False)))

    import gym_bridge
    from gym_bridge.core.record import with_train_step
    from gym_bridge.core.rollout_file import RolloutWriter
    from trl import GRPOConfig, GRPOTrainer

    model = config.get("model")
    if model is None:
        from gym_bridge.policies.embedded import embedded_model_path

        model = str(embedded_model_path())

    grpo_args = GRPOConfig(**(config.get("grpo") or {}))
    assert grpo_args.output_dir is not None  # TrainingArguments.__post_init__ defaults it to trainer_output
    output_dir = Path(grpo_args.output_dir)
    paths, weights = dataset_sources(config.get("datasets") or [], Path(args.config).parent, output_dir / "data")
    train_dataset = gym_bridge.trl.load_dataset(paths, weights=weights, **(config.get("dataset") or {}))

    rollout_options = dict(config.get("gym_bridge") or {})
    records_dir = rollout_options.pop("records_dir", "rollouts")
    if rollout_options.pop("journal", False):
        rollout_options["journal_dir"] = str(output_dir / "rollout_journal")
    _ = grpo_args.device  # sets up the launch's process group, through which the ranks agree on run_dir
    check_world_size(os.environ.get("GYM_BRIDGE_WORLD_SIZE"))
    run_dir = run_directory(output_dir / (records_dir or "runs"))
    writer = None
    trainer: Any = None
    if records_dir is not None:
        rank = int(os.environ.get("RANK", "0"))
        writer = RolloutWriter(run_dir / f"rollouts.rank{rank}.jsonl", append=False)
        if rank == 0:
            print(f"gym_bridge: rollout records go to {run_dir}", flush=True)

        def write_records(records: list[Any]) -> None:
            step = trainer.state.global_step if trainer is not None else 0
            for record in records:
                writer.write(with_train_step(record.to_dict(), step))

        rollout_options["on_records"] = write_records
    server = rollout_options.pop("generation_server", None)
    if server is not None:
        rollout_options["policy"] = frozen_server_policy(server, use_vllm=bool(grpo_args.use_vllm))
    rollout = gym_bridge.trl.make_rollout(**rollout_options)

    peft_config = None
    if config.get("peft"):
        from peft import LoraConfig

        peft_config = LoraConfig(**config["peft"])

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=gym_bridge.trl.env_reward,
        args=grpo_args,
        train_dataset=train_dataset,
        rollout_func=rollout,
        peft_config=peft_config,
    )
    use_compact_log(trainer)
    prepared = rollout.prepare(trainer)  # backend, template and settings: fail now, not at the first batch
    if prepared.journal is not None:  # a run that ends normally leaves no journal behind
        trainer.add_callback(prepared.journal.end_callback())
    tasks = rollout.check_dataset(trainer)
    if trainer.accelerator.is_main_process:
        print(f"gym_bridge: {len(train_dataset)} rows, {tasks} tasks from {[str(p) for p in paths]}", flush=True)

    trainer.train(resume_from_checkpoint=config.get("resume_from_checkpoint"))

    if writer is not None:
        writer.close()
    if trainer.accelerator.is_main_process:
        history = json.dumps(trainer.state.log_history, indent=1)
        (run_dir / "log_history.json").write_text(history)  # this run's, next to its records
        (output_dir / "log_history.json").write_text(history)  # the latest run's
        print(f"gym_bridge: training log in {run_dir / 'log_history.json'}", flush=True)
    if config.get("save_model", False):
        trainer.save_model()
        if trainer.accelerator.is_main_process:
            print(f"gym_bridge: trained model saved to {output_dir} (load it with --model {output_dir})", flush=True)
    elif trainer.accelerator.is_main_process:
        print("gym_bridge: the trained weights were not saved (--set save_model=true keeps them)", flush=True)


if __name__ == "__main__":
    main()
