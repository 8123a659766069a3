"""Wall time of a GRPO step with `rollout_func=gym_bridge.trl.rollout` against TRL's own generation.

Same model (the embedded SmolLM2-135M-Instruct on the CPU, or --model), same prompts (the math
environment's rows: single-turn, no tools, so both render the same prompt ids), same
`max_completion_length`, `num_generations`, batch and sampling settings. Both generate with the
trainer's model through `model.generate`. To compare equal work, the model's EOS is moved to a
token it never samples (`<empty_output>`), so every completion in both runs is exactly
`max_completion_length` tokens long; the script checks this and also reports tokens per second.

What is timed, per optimizer step:
- `step_time_s`: TRL's own `step_time` metric (GRPOTrainer.training_step: generation, scoring,
  forward and backward of one step). `step_time_ratio` = median gym_bridge / median native.
- `generation_s`: the wall time of the trainer's `_generate(prompts)` call, measured by wrapping
  that method on each trainer (one call per step here). For the native arm it holds TRL's prompt
  tokenization and `_generate_single_turn` (its `model.generate`); for the gym_bridge arm it holds
  the `rollout_func` call (task lookup, prompt rendering, generation through the same
  `model.generate`, parsing, verification, the batch for TRL). Both include TRL's decoding of
  the completions that follows. `generation_ratio` = median gym_bridge / median native: the
  whole-step ratio hides generation overhead behind the forward and backward passes.
Every figure is a median with [min, max] over the measured steps.

Threads: gym_bridge generates in a worker thread, TRL in the main thread. With several OpenMP
threads on a loaded machine the main thread's thread team can stall on its barriers and the
comparison then flatters gym_bridge by a large factor, so both run single-threaded by default
(`--threads 1`); `--threads 0` keeps torch's default for comparison.

The two trainers run in alternating rounds (native, gym_bridge, native, ...) of a few steps, the
first step of each round discarded as warm-up, so load from other processes hits both alike.

Multi-turn tool calling (`multi_turn` key; `--multi-turn-steps 0` skips it): gym_bridge only,
since TRL's own generation here is single-turn. The `multi_step` environment's rows (two tools,
a system prompt asking for several calls) through `rollout_func` with the model's real EOS, up to
`--multi-turn-max-turns` model calls and `--multi-turn-length` tokens per rollout. Reported: step
time, generation time and its share of the step, model tokens per second of generation, and the
model calls and tool calls per rollout actually made. The embedded 135M model rarely writes a tool
call, so with it this case is mostly single-turn (the turns and calls per rollout say so); give
--model a tool-calling model for a real multi-turn measurement.

    .venv/bin/python benchmarks/trl_step.py          # 3 rounds x 3 steps per arm, then 1 + 2 multi-turn steps: about 15 min
    .venv/bin/python benchmarks/trl_step.py --quick  # smoke run: 16-token completions, 2 rounds x 2 steps, 1 + 1 multi-turn steps
                                                     # of 64 tokens: 5.2 min at load average 3 on 2 cores

A multi-turn step costs several single-turn ones: its prompts (system prompt, two tool schemas)
are about ten times longer, and the forward and backward passes run over them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

FIXED_LENGTH_EOS = "<empty_output>"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="local model folder (default: the embedded model)")
    parser.add_argument("--rows", type=int, default=8, help="completions per step")
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--completion-length", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps-per-round", type=int, default=3, help="the first of each round is warm-up")
    parser.add_argument("--threads", type=int, default=1, help="torch/OpenMP threads (0: torch's default)")
    parser.add_argument("--multi-turn-steps", type=int, default=2, help="measured steps of the multi-turn case (0: skip it)")
    parser.add_argument("--multi-turn-max-turns", type=int, default=6)
    parser.add_argument("--multi-turn-length", type=int, default=128, help="max_completion_length of the multi-turn case")
    parser.add_argument("--quick", action="store_true", help="smoke run: 16-token completions, 2 rounds of 2 steps, 1 multi-turn step")
    options = parser.parse_args()
    if options.quick:
        options.completion_length, options.rounds, options.steps_per_round = 16, 2, 2
        options.multi_turn_steps, options.multi_turn_length = min(options.multi_turn_steps, 1), 64
    return options


def build_trainer(kind: str, model_path: str, prompts: list[str], options: argparse.Namespace, output_dir: str):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    import gym_bridge

    multi_turn = kind == "multi_turn"
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    if not multi_turn:
        tokenizer.eos_token = FIXED_LENGTH_EOS
        eos_id = tokenizer.convert_tokens_to_ids(FIXED_LENGTH_EOS)
        model.generation_config.eos_token_id = eos_id
        model.config.eos_token_id = eos_id
    args = GRPOConfig(
        output_dir=output_dir, use_cpu=True, use_vllm=False, report_to="none", bf16=False, seed=0,
        per_device_train_batch_size=options.rows, num_generations=options.num_generations,
        max_completion_length=options.multi_turn_length if multi_turn else options.completion_length,
        temperature=1.0, top_p=1.0, top_k=0,
        learning_rate=1e-6, beta=0.0, logging_steps=1, save_strategy="no", disable_tqdm=True,
        max_steps=options.multi_turn_steps + 1 if multi_turn else options.steps_per_round,
    )
    if kind == "native":
        dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": text}] for text in prompts]})
        trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=args,
                              train_dataset=dataset, processing_class=tokenizer)
    else:
        if multi_turn:
            from gym_bridge.core.task import iter_jsonl
            from gym_bridge.core.registry import get_environment

            rows = [row for _, row in iter_jsonl(get_environment("multi_step").example_data)]
            # the template check is on: tool turns must be append-only for this template
            records: list = []
            rollout = gym_bridge.trl.make_rollout(max_turns=options.multi_turn_max_turns, on_records=records.extend)
        else:
            rows = [{"prompt": text, "environment": "math", "expected_answer": "0"} for text in prompts]
            # single-turn rows and a relocated EOS: the append-only check (about tool turns) does not apply
            rollout = gym_bridge.trl.make_rollout(template_check="off", max_turns=1)
        dataset = gym_bridge.trl.load_dataset(rows)
        trainer = GRPOTrainer(model=model, reward_funcs=gym_bridge.trl.env_reward, args=args, train_dataset=dataset,
                              processing_class=tokenizer, rollout_func=rollout)
        if not multi_turn:
            # the template's own end of turn, for reading the template; generation still stops only at the relocated EOS
            # (the model's and tokenizer's), which the fixed-length check below confirms
            end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")  # the embedded model's; --model: pass its own here
            if isinstance(end_of_turn, int) and end_of_turn != tokenizer.unk_token_id:
                trainer.eos_token_ids = [*trainer.eos_token_ids, end_of_turn]
        rollout.prepare(trainer)
    trainer.records = records if multi_turn else []  # the multi-turn case's rollout records
    trainer.generation_s = []  # wall seconds of each `_generate` call
    generate = trainer._generate

    def timed_generate(batch_prompts):
        started = time.perf_counter()
        try:
            return generate(batch_prompts)
        finally:
            trainer.generation_s.append(time.perf_counter() - started)

    trainer._generate = timed_generate
    return trainer


def train_round(trainer) -> tuple[list[dict], list[float]]:
    """One `train()` call: its step log entries and generation times, warm-up step dropped."""
    trainer.generation_s.clear()
    trainer.train()  # a fresh TrainerState each call: its log holds this round only
    entries = [entry for entry in trainer.state.log_history if "step_time" in entry]
    if len(trainer.generation_s) != len(entries):
        raise SystemExit(f"expected one generation per step, got {len(trainer.generation_s)} for {len(entries)} steps")
    return entries[1:], trainer.generation_s[1:]


def spread(values: list[float], digits: int = 3) -> dict[str, object]:
    return {"median": round(statistics.median(values), digits), "min_max": [round(min(values), digits), round(max(values), digits)]}


def main() -> None:
    options = parse_args()
    if options.threads:
        os.environ["OMP_NUM_THREADS"] = str(options.threads)  # before torch starts its thread pool
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    import tempfile

    import torch

    from gym_bridge.core.task import iter_jsonl
    from gym_bridge.core.registry import get_environment

    if options.threads:
        torch.set_num_threads(options.threads)
    model_path = options.model
    if model_path is None:
        from gym_bridge.policies.embedded import embedded_model_path

        model_path = str(embedded_model_path())
    math_rows = [row for _, row in iter_jsonl(get_environment("math").example_data)]
    groups = options.rows // options.num_generations
    prompts = [math_rows[i % len(math_rows)]["responses_create_params"]["input"][-1]["content"] for i in range(groups * options.rounds * options.steps_per_round)]

    steps: dict[str, list[float]] = {"native": [], "gym_bridge": []}
    generation: dict[str, list[float]] = {"native": [], "gym_bridge": []}
    lengths: dict[str, set[float]] = {"native": set(), "gym_bridge": set()}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        trainers = {kind: build_trainer(kind, model_path, prompts, options, f"{scratch}/{kind}") for kind in steps}
        for _ in range(options.rounds):
            for kind, trainer in trainers.items():
                entries, generation_s = train_round(trainer)
                steps[kind].extend(entry["step_time"] for entry in entries)
                generation[kind].extend(generation_s)
                for entry in trainer.state.log_history:
                    if "step_time" in entry:
                        lengths[kind].update({entry["completions/min_length"], entry["completions/max_length"]})
        trainers.clear()
        multi_turn = None
        if options.multi_turn_steps:
            trainer = build_trainer("multi_turn", model_path, prompts, options, f"{scratch}/multi_turn")
            entries, generation_s = train_round(trainer)
            step_s = [entry["step_time"] for entry in entries]
            per_step = options.rows
            measured = trainer.records[per_step:]  # the warm-up step's rollouts dropped
            model_tokens = [sum(sum(record.tokens.completion_mask) for record in measured[i:i + per_step])
                            for i in range(0, len(measured), per_step)]
            multi_turn = {
                "environment": "multi_step",
                "max_turns": options.multi_turn_max_turns,
                "max_completion_length": options.multi_turn_length,
                "measured_steps": len(entries),
                "step_time_s": spread(step_s),
                "generation_s": spread(generation_s),
                "generation_share_of_step": round(statistics.median(g / s for g, s in zip(generation_s, step_s)), 3),
                "model_tokens_per_s_of_generation": round(statistics.median(t / g for t, g in zip(model_tokens, generation_s)), 1),
                "model_calls_per_rollout": round(statistics.mean(record.turns for record in measured), 2),
                "tool_calls_per_rollout": round(statistics.mean(record.tool_calls for record in measured), 2),
                "failed_rollouts": sum(record.failed for record in measured),
            }
    wall_s = time.perf_counter() - started

    tokens_per_step = options.rows * options.completion_length
    step_medians = {kind: statistics.median(values) for kind, values in steps.items()}
    generation_medians = {kind: statistics.median(values) for kind, values in generation.items()}
    result = {
        "benchmark": "trl_step",
        "model": os.path.basename(model_path.rstrip("/")),
        "device": "cpu",
        "torch_threads": torch.get_num_threads(),
        "rows_per_step": options.rows,
        "num_generations": options.num_generations,
        "max_completion_length": options.completion_length,
        "completion_lengths_seen": {kind: sorted(values) for kind, values in lengths.items()},
        "fixed_length": all(values == {float(options.completion_length)} for values in lengths.values()),
        "measured_steps": {kind: len(values) for kind, values in steps.items()},
        "step_time_s": {kind: spread(values) for kind, values in steps.items()},
        "generation_s": {kind: spread(values) for kind, values in generation.items()},
        "generation_share_of_step": {kind: round(generation_medians[kind] / step_medians[kind], 3) for kind in steps},
        "completion_tokens_per_s_of_generation": {kind: round(tokens_per_step / value, 1) for kind, value in generation_medians.items()},
        "step_time_ratio": round(step_medians["gym_bridge"] / step_medians["native"], 3),
        "generation_ratio": round(generation_medians["gym_bridge"] / generation_medians["native"], 3),
        "target_ratio": 1.10,
        "multi_turn": multi_turn,
        "wall_s": round(wall_s, 1),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
