"""Does the CPU demo learn? Held-out reward of the embedded model before and after GRPO, per seed.

    .venv/bin/python benchmarks/learning_curve.py [--seeds 0,1,2] [--steps 30] [--eval-size 64] [--jobs 2] [--reuse]

1. `--eval-size` held-out `arithmetic` problems (the environment's `validation` split, which shares
   no problem with `train`) are answered by the embedded SmolLM2-135M-Instruct with `gym-bridge eval`,
   as a user would run it: `--samples` answers per problem at the recipe's training temperature
   (seed 0), and one greedy answer. Reward (1 right, 0.1 another boxed integer, 0 else) and accuracy
   (the `correct` component) are averaged: `reward`/`accuracy` sampled, `greedy_*` greedy.
2. For each seed, `python recipes/trl_grpo.py --config recipes/configs/trl_grpo_cpu_demo.yaml`
   trains `--steps` GRPO steps on train problems drawn with that seed (`--set` overrides only for the
   seed, the step count and the output folder), saving the model; the peak resident memory of its
   whole process tree is sampled every 0.2 s. `--jobs 2` trains two seeds at once with one core each
   (`threads` in `per_seed`); `--reuse` keeps a seed's model trained earlier with the same settings.
3. The trained model answers the same held-out problems the same way.

The last line is JSON: `reward_before`, `reward_after`, `accuracy_before`, `accuracy_after` and the
`greedy_` ones (after: medians over seeds with `_min`/`_max`), `steps`, `minutes` (training wall time per seed, median),
`peak_rss_gb` (the largest over seeds) and `per_seed`. `--plot` writes a PNG of the training reward
per step (each seed, and the mean over seeds smoothed over 5 steps) with the held-out rewards.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
PYTHON = sys.executable
GYM_BRIDGE = [str(Path(PYTHON).parent / "gym-bridge")]
CONFIG = ROOT / "recipes" / "configs" / "trl_grpo_cpu_demo.yaml"
RSS_LIMIT_GB = 4.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="0,1,2", help="training seeds, comma-separated")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--eval-size", type=int, default=64, help="held-out problems")
    parser.add_argument("--samples", type=int, default=4, help="sampled answers per held-out problem")
    parser.add_argument("--eval-seed", type=int, default=1000, help="seed of the held-out problems")
    parser.add_argument("--config", default=str(CONFIG))
    parser.add_argument("--output", default=str(ROOT / "out" / "learning_curve"))
    parser.add_argument("--plot", default=str(ROOT / "docs" / "learning_curve.png"), help="PNG to write ('' for none)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="seeds trained at once, the cores shared out among them (minutes are then per job's share)")
    parser.add_argument("--reuse", action="store_true",
                        help="keep a seed's model when its folder holds one trained with the same settings")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="more recipe overrides for training (repeatable), e.g. grpo.learning_rate=1e-5")
    return parser.parse_args()


def run(command: list[str], log: Path, threads: int | None = None) -> float:
    """Run `command` (output to `log`; `threads`: its torch/OpenMP threads); its process tree's
    peak RSS in GB. Raises on failure."""
    import psutil

    env = {**os.environ, "PYTHONPATH": str(ROOT), **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
        peak = [0]

        def sample() -> None:
            root = psutil.Process(process.pid)
            while process.poll() is None:
                try:
                    tree = [root, *root.children(recursive=True)]
                    peak[0] = max(peak[0], sum(p.memory_info().rss for p in tree if p.is_running()))
                except psutil.Error:
                    pass
                time.sleep(0.2)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        code = process.wait()
        sampler.join()
    if code != 0:
        raise SystemExit(f"{' '.join(command)} failed with exit code {code}; see {log}")
    return peak[0] / 2**30


def held_out_scores(model: str | None, data: Path, out_dir: Path, name: str, *, samples: int, temperature: float) -> dict[str, float]:
    """`model`'s answers (None: the embedded model) to the held-out rows, `samples` per problem at
    the training temperature (seeded), and one greedy answer each: mean reward and accuracy."""
    scores = {}
    for label, extra in (("", ["--temperature", str(temperature), "--num-repeats", str(samples), "--seed", "0"]),
                         ("greedy_", ["--temperature", "0"])):
        records = out_dir / f"eval_{label}{name}.jsonl"
        records.unlink(missing_ok=True)
        command = [*GYM_BRIDGE, "eval", "--data", str(data), *extra, "--max-new-tokens", "32", "--concurrency", "32",
                   "--no-progress", "--output", str(records)]
        if model is not None:
            command += ["--model", model]
        run(command, out_dir / f"eval_{label}{name}.log")
        rows = [json.loads(line) for line in records.read_text().splitlines()]
        scores[f"{label}reward"] = statistics.fmean(row["reward"] for row in rows)
        scores[f"{label}accuracy"] = statistics.fmean(row["reward_components"].get("correct", 0.0) for row in rows)
    return scores


def spread(values: list[float], name: str) -> dict[str, float]:
    return {name: round(statistics.median(values), 4), f"{name}_min": round(min(values), 4), f"{name}_max": round(max(values), 4)}


def plot(path: Path, curves: dict[int, list[float]], before: float, after: dict[int, float], steps: int, grpo: dict) -> Any:
    """Draw the curves into `path` and return the figure. The legend sits under the axes, where it covers no curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 5.2), dpi=110)
    for seed, rewards in curves.items():
        axis.plot(range(1, len(rewards) + 1), rewards, alpha=0.35, linewidth=1, label=f"train reward, seed {seed}")
    mean = [statistics.fmean(values) for values in zip(*curves.values())]
    smooth = [statistics.fmean(mean[max(0, i - 4):i + 1]) for i in range(len(mean))]
    axis.plot(range(1, len(smooth) + 1), smooth, color="black", linewidth=2, label="train reward, mean over seeds (5-step average)")
    axis.axhline(before, color="tab:red", linestyle="--", label=f"held-out reward before: {before:.3f}")
    axis.scatter([steps] * len(after), list(after.values()), color="tab:green", zorder=3,
                 label=f"held-out reward after (per seed): {', '.join(f'{v:.3f}' for v in after.values())}")
    completions = grpo["per_device_train_batch_size"] * grpo.get("gradient_accumulation_steps", 1)
    groups = grpo["num_generations"]
    axis.set_xlabel(f"GRPO step ({completions} completions: {completions // groups} problems x {groups})")
    axis.set_ylabel("reward")
    axis.set_title("Embedded SmolLM2-135M-Instruct, GRPO on 2 CPU cores (arithmetic)")
    axis.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, bbox_inches="tight")
    return figure


def recipe_config(config: str, overrides: list[str]) -> dict[str, Any]:
    """The config `recipes/trl_grpo.py --config CONFIG --set ...` runs with, read by the recipe's own loader."""
    from gym_bridge.trl import load_recipe_config

    return load_recipe_config(config, overrides)


def training_settings(command: list[str]) -> dict[str, Any]:
    """The recipe config a training command runs with, its output folder left out: what decides
    whether a model trained earlier can be reused."""
    config = recipe_config(command[command.index("--config") + 1],
                           [command[i + 1] for i, argument in enumerate(command) if argument == "--set"])
    config["grpo"].pop("output_dir")
    return config


def train_seeds(args: argparse.Namespace, seeds: list[int], out_dir: Path) -> dict[int, dict[str, Any]]:
    """Train every seed (`--jobs` at a time, the cores shared out among them); per seed its
    `minutes`, `peak_rss_gb` and `threads`. With `--reuse`, a seed whose folder holds a model trained
    with the same command is not trained again: its recorded figures are used."""
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    results: dict[int, dict[str, Any]] = {}

    def train(seed: int) -> None:
        run_dir = out_dir / f"seed-{seed}"
        command = [
            PYTHON, "recipes/trl_grpo.py", "--config", args.config,
            "--set", f"grpo.seed={seed}", "--set", f"dataset.seed={seed}", "--set", f"datasets.0.prepare.seed={seed}",
            "--set", f"grpo.max_steps={args.steps}", "--set", f"grpo.output_dir={run_dir}", "--set", "save_model=true",
            *[argument for override in args.set for argument in ("--set", override)],
        ]
        stats_file = run_dir / "train_stats.json"
        settings = training_settings(command)
        if args.reuse and stats_file.exists():
            recorded = json.loads(stats_file.read_text())
            if recorded["settings"] == settings:
                print(f"seed {seed}: reusing the model trained in {run_dir}", file=sys.stderr, flush=True)
                results[seed] = recorded["stats"]
                return
        started = time.perf_counter()
        peak_gb = run(command, out_dir / f"train_seed{seed}.log", threads=threads)
        stats = {"minutes": round((time.perf_counter() - started) / 60, 2), "peak_rss_gb": round(peak_gb, 2), "threads": threads}
        stats_file.write_text(json.dumps({"settings": settings, "stats": stats}))
        results[seed] = stats

    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for future in [pool.submit(train, seed) for seed in seeds]:
            future.result()
    return results


def main() -> None:
    args = parse_args()
    seeds = [int(seed) for seed in args.seeds.split(",")]
    out_dir = Path(args.output)
    out_dir.mkdir(parents=True, exist_ok=True)
    held_out = out_dir / "held_out.jsonl"
    subprocess.run([*GYM_BRIDGE, "data", "prepare", "arithmetic", "--split", "validation", "--size", str(args.eval_size),
                    "--seed", str(args.eval_seed), "--output", str(held_out)], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    grpo = recipe_config(args.config, args.set)["grpo"]  # with --set, as training will run
    temperature = float(grpo["temperature"])
    evaluate = functools.partial(held_out_scores, data=held_out, out_dir=out_dir, samples=args.samples, temperature=temperature)
    before = evaluate(None, name="before")
    print(f"before: {before}", file=sys.stderr, flush=True)

    trained = train_seeds(args, seeds, out_dir)
    per_seed = []
    curves: dict[int, list[float]] = {}
    for seed in seeds:
        run_dir, stats = out_dir / f"seed-{seed}", trained[seed]
        history = json.loads((run_dir / "log_history.json").read_text())
        curves[seed] = [entry["reward"] for entry in history if "reward" in entry]
        after = evaluate(str(run_dir), name=f"after_seed{seed}")
        per_seed.append({"seed": seed, **{f"{key}_after": round(value, 4) for key, value in after.items()}, **stats,
                         "train_reward_first5": round(statistics.fmean(curves[seed][:5]), 4),
                         "train_reward_last5": round(statistics.fmean(curves[seed][-5:]), 4)})
        print(f"seed {seed}: {per_seed[-1]}", file=sys.stderr, flush=True)

    if args.plot:
        plot(Path(args.plot), curves, before["reward"], {s["seed"]: s["reward_after"] for s in per_seed}, args.steps, grpo)
    result = {
        **{f"{key}_before": round(value, 4) for key, value in before.items()},
        **{k: v for key in before for k, v in spread([s[f"{key}_after"] for s in per_seed], f"{key}_after").items()},
        "steps": args.steps, "minutes": round(statistics.median(s["minutes"] for s in per_seed), 2),
        "peak_rss_gb": max(s["peak_rss_gb"] for s in per_seed), "rss_limit_gb": RSS_LIMIT_GB,
        "held_out_problems": args.eval_size, "seeds": seeds, "jobs": args.jobs, "per_seed": per_seed,
        "cpu_count": os.cpu_count(), "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(result))
    if result["peak_rss_gb"] >= RSS_LIMIT_GB:
        raise SystemExit(f"peak RSS {result['peak_rss_gb']} GB is over the {RSS_LIMIT_GB} GB bound")


if __name__ == "__main__":
    main()
