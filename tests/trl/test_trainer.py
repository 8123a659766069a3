"""Real TRL 1.16 GRPOTrainer runs with gym_bridge's rollout function on a tiny local model.

One process and two (`torchrun --nproc_per_node 2`, gloo on the CPU) train for two steps on
weather, multi_step and math rows with a scripted policy that calls tools, so environment tokens
exist and rewards vary within groups. The trainer's own model generates in the backend test (with
gradient checkpointing on); the recipe runs the embedded model in the `slow` test.

This file is also the torchrun worker: `python -m torch.distributed.run ... test_trainer.py MODEL OUT`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gym_bridge import Environment, VerifyResult, final_text

REPO = Path(__file__).resolve().parents[2]
WEATHER_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def train_scripted(model_dir: str, output_dir: str, *, per_device_batch: int) -> dict:
    """Train 2 steps on 2 rows each of weather, multi_step and math (in that order, groups of 2).

    Repeat 0 of every task calls get_weather (a tool error outside weather) and answers \\boxed{12};
    repeat 1 answers at once. Returns what the test checks, per rank.
    """
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    import gym_bridge
    from gym_bridge.trl._dataset import REGISTRY
    from gym_bridge.core.policy import Generation, ScriptedPolicy
    from gym_bridge.core.task import iter_jsonl

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    paths = gym_bridge.trl.example_data_paths(["weather", "multi_step", "math"])
    dataset = gym_bridge.trl.load_dataset([[row for _, row in iter_jsonl(path)][:2] for path in paths])

    def turn(text: str) -> Generation:
        ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        return Generation(token_ids=ids, logprobs=[-0.25] * len(ids), finish_reason="stop")

    script = {}
    for key in dataset["task_key"]:
        position = REGISTRY.get(key).position
        script[f"{position}-0"] = [turn(WEATHER_CALL), turn("It is \\boxed{12}.")]
        script[f"{position}-1"] = [turn("No idea.")]
    records, outputs = [], []
    rollout = gym_bridge.trl.make_rollout(policy=ScriptedPolicy(script, record_calls=False), on_records=records.extend)

    def spy(prompts, trainer):
        out = rollout(prompts, trainer)
        outputs.append({"prompts": list(prompts), **out})
        return out

    args = GRPOConfig(
        output_dir=output_dir, use_cpu=True, use_vllm=False, report_to="none", per_device_train_batch_size=per_device_batch,
        num_generations=2, max_completion_length=96, max_steps=2, learning_rate=1e-2, save_strategy="no", logging_steps=1,
        shuffle_dataset=False, bf16=False, seed=0,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=gym_bridge.trl.env_reward, args=args, train_dataset=dataset,
                          processing_class=tokenizer, rollout_func=spy)
    before = {name: param.detach().clone() for name, param in model.named_parameters()}
    trainer.train()
    return {
        "rank": trainer.accelerator.process_index,
        "world": trainer.accelerator.num_processes,
        "changed": sum(not torch.equal(before[name], param.detach()) for name, param in model.named_parameters()),
        "params": len(before),
        "checksum": float(sum(param.detach().double().abs().sum() for param in model.parameters())),
        "outputs": outputs,
        "records": [record.to_dict() for record in records],
        "log": trainer.state.log_history,
    }


def check_rows(result: dict, eos_token_id: int) -> None:
    """Every output row matches its record: ids, mask (1 exactly on sampled tokens), log-probs."""
    from tests.support.invariants import assert_token_invariants

    rows = [
        {key: out[key][i] for key in out}
        for out in result["outputs"] for i in range(len(out["prompts"]))
    ]
    assert len(rows) == len(result["records"])
    for out in result["outputs"]:
        assert all(len(values) == len(out["prompts"]) for values in out.values())
    for row, record in zip(rows, result["records"]):
        assert_token_invariants(record)
        tokens = record["tokens"]
        assert row["prompt_ids"] == tokens["prompt_ids"]
        assert row["completion_ids"] == tokens["completion_ids"] and row["env_mask"] == tokens["completion_mask"]
        assert len(row["logprobs"]) == len(row["completion_ids"]) and row["completion_ids"][-1] == eos_token_id
        sampled = [token for item in record["response"]["output"] for token in item.get("generation_token_ids", [])]
        assert [token for token, m in zip(row["completion_ids"], row["env_mask"]) if m] == sampled
        env_items = [item for item in record["response"]["output"] if item["type"] == "function_call_output"]
        assert (0 in row["env_mask"]) == bool(env_items)  # env tokens exist exactly where a tool answered
        assert row["env_reward"] == record["reward"] and row["env_name"] == record["env"]


def test_grpo_trainer_trains_with_gym_bridge_rollouts(tiny_model_dir, tmp_path, smol_tokenizer):
    result = train_scripted(str(tiny_model_dir), str(tmp_path), per_device_batch=6)
    assert result["changed"] == result["params"] > 0
    check_rows(result, smol_tokenizer.eos_token_id)
    records = result["records"]
    assert {record["env"] for record in records} == {"weather", "multi_step", "math"}
    # 2 steps of 6 rows, groups kept together: rows 2k and 2k+1 are repeats 0 and 1 of one task
    assert len(records) == 12
    assert all(records[i]["task_index"] == records[i + 1]["task_index"] for i in range(0, 12, 2))
    assert [record["repeat_index"] for record in records] == [0, 1] * 6
    assert sorted({record["reward"] for record in records}) == [0.0, 1.0]
    # the tool output is environment text: the weather answer's tokens are masked
    weather = next(r for r in records if r["env"] == "weather" and r["metrics"]["tool_calls"])
    env_ids = [t for t, m in zip(weather["tokens"]["completion_ids"], weather["tokens"]["completion_mask"]) if not m]
    assert "The weather in Paris is cold." in smol_tokenizer.decode(env_ids)
    logged = [entry for entry in result["log"] if "loss" in entry]
    assert len(logged) == 2 and all("rewards/env_reward/mean" in entry and "gym_bridge/failed" in entry for entry in logged)


@pytest.mark.slow  # about 35 s (torchrun); by default: one rank above, the rank layout in test_rollout.py
@pytest.mark.integration
def test_two_ranks_split_a_group_and_stay_consistent(tiny_model_dir, tmp_path, smol_tokenizer):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               __file__, str(tiny_model_dir), str(tmp_path)]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    for result in ranks:
        assert result["changed"] == result["params"]
        check_rows(result, smol_tokenizer.eos_token_id)
    assert ranks[0]["checksum"] == pytest.approx(ranks[1]["checksum"], rel=1e-9)  # DDP kept the ranks in step
    # per step: 6 rows = 3 groups of 2 over 2 ranks of 3 rows, so the middle group is split
    for step in range(2):
        first, second = ranks[0]["records"][3 * step : 3 * step + 3], ranks[1]["records"][3 * step : 3 * step + 3]
        assert first[2]["task_index"] == second[0]["task_index"]
        assert (first[2]["repeat_index"], second[0]["repeat_index"]) == (0, 1)
        assert [r["repeat_index"] for r in first + second] == [0, 1, 0, 1, 0, 1]


def test_default_rollout_generates_with_the_trainers_model(tiny_model_dir, smol_tokenizer):
    """No vLLM: the trainer's model generates (gradient checkpointing on), log-probs are what the trainer recomputes."""
    result = generate_with_trainer_model(str(tiny_model_dir), peft=False)
    check_generated(result, smol_tokenizer)


def test_default_rollout_generates_with_a_peft_model(tiny_model_dir, smol_tokenizer):
    pytest.importorskip("peft")
    result = generate_with_trainer_model(str(tiny_model_dir), peft=True)
    check_generated(result, smol_tokenizer)


def generate_with_trainer_model(model_dir: str, *, peft: bool) -> dict:
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    import gym_bridge

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dataset = gym_bridge.trl.load_dataset(gym_bridge.trl.example_data_paths(["weather", "math"]), limit=1)
    peft_config = None
    if peft:
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    args = GRPOConfig(output_dir="/tmp/unused", use_cpu=True, use_vllm=False, report_to="none", per_device_train_batch_size=4,
                      num_generations=2, max_completion_length=16, temperature=0.7, gradient_checkpointing=True, bf16=False)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=gym_bridge.trl.env_reward, args=args,
                          train_dataset=dataset, processing_class=tokenizer, rollout_func=gym_bridge.trl.rollout, peft_config=peft_config)
    model = trainer.model
    model.train()
    model.gradient_checkpointing_enable()  # as Trainer.train() does; generation must switch it off and back on
    prompts = [prompt for prompt in dataset["prompt"] for _ in range(2)]
    out = gym_bridge.trl.rollout(prompts, trainer)
    state = {"training": model.training, "checkpointing": model.is_gradient_checkpointing}
    # what TRL computes for the loss: log-softmax of logits / temperature at the completion ids
    recomputed = []
    with torch.no_grad():
        model.eval()
        for prompt_ids, completion_ids in zip(out["prompt_ids"], out["completion_ids"]):
            logits = model(torch.tensor([prompt_ids + completion_ids])).logits[0, len(prompt_ids) - 1 : -1]
            logps = torch.log_softmax(logits.float() / 0.7, dim=-1).gather(1, torch.tensor(completion_ids)[:, None])[:, 0]
            recomputed.append(logps.tolist())
    return {"prompts": prompts, "out": out, "recomputed": recomputed, **state}


def check_generated(result: dict, tokenizer) -> None:
    out = result["out"]
    assert len(out["completion_ids"]) == len(result["prompts"]) == 4
    assert result["training"] is True and result["checkpointing"] is True  # restored after generation
    for ids, mask, logprobs, recomputed in zip(out["completion_ids"], out["env_mask"], out["logprobs"], result["recomputed"]):
        assert 0 < len(ids) <= 16 and len(mask) == len(logprobs) == len(ids)
        model_positions = [i for i, m in enumerate(mask) if m]
        assert model_positions, "the model generated nothing"
        assert [logprobs[i] for i in model_positions] == pytest.approx([recomputed[i] for i in model_positions], abs=2e-4)
    assert set(out["env_name"]) == {"weather", "math"}


class CapitalCity(Environment):
    """Name a country's capital; reward 1 if the answer mentions it. The 135M model is right now and
    then, so its rewards vary (the slow recipe test routes rows here by module path)."""

    name = "capital_city_for_trl_test"

    def verify(self, task, output):
        return VerifyResult(reward=float(task.get("expected_answer", "?").lower() in final_text(output).lower()))


@pytest.mark.slow
@pytest.mark.timeout(1800)  # about 5 minutes on 2 quiet cores
def test_recipe_trains_the_embedded_model_on_the_cpu(tmp_path):
    """`python recipes/trl_grpo.py --config recipes/configs/trl_grpo_cpu_demo.yaml` for 3 steps of 8 rollouts,
    mixing weather rows (tools) with capital-city questions the embedded model sometimes gets right."""
    capitals = [{"prompt": f"What is the capital of {country}? Answer in one word.", "expected_answer": city,
                 "environment": "tests.trl.test_trainer:CapitalCity"} for country, city in (("France", "Paris"), ("Italy", "Rome"), ("Japan", "Tokyo"))]
    data = tmp_path / "capitals.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in capitals))
    output = tmp_path / "run"
    command = [
        sys.executable, "recipes/trl_grpo.py", "--config", "recipes/configs/trl_grpo_cpu_demo.yaml",
        "--set", f"datasets=[{{path: {data}, weight: 3}}, {{env: weather, weight: 1}}]", "--set", "dataset.num_rows=16",
        "--set", "grpo.max_steps=3", "--set", "grpo.max_completion_length=64", "--set", "gym_bridge.max_turns=3",
        "--set", "grpo.per_device_train_batch_size=8", "--set", "grpo.gradient_accumulation_steps=1", "--set", "grpo.num_generations=4", "--set", f"grpo.output_dir={output}",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, done.stderr[-4000:]
    steps = [entry for entry in json.loads((output / "log_history.json").read_text()) if "loss" in entry]
    assert len(steps) == 3 and all("rewards/env_reward/mean" in entry and "gym_bridge/failed" in entry for entry in steps)
    assert json.loads((output / "rollouts" / "run-1" / "log_history.json").read_text()) == json.loads((output / "log_history.json").read_text())
    records = [json.loads(line) for line in (output / "rollouts" / "run-1" / "rollouts.rank0.jsonl").read_text().splitlines()]
    steps_seen = {record["metrics"]["train_step"] for record in records}
    assert 0 in steps_seen and steps_seen <= {0, 1, 2}  # optimizer steps done when each batch was generated
    rewards = [record["reward"] for record in records if not record["mask_sample"]]
    assert len(records) == 3 * 8 and len(set(rewards)) > 1, "the environment rewards did not vary"
    logged = [entry["rewards/env_reward/mean"] for entry in steps] + [entry["rewards/env_reward/std"] for entry in steps]
    assert any(value > 0 for value in logged)
    assert (output / "model.safetensors").is_file() and f"trained model saved to {output}" in done.stdout  # the demo keeps its weights
    assert "TRL currently supports vLLM versions" not in done.stderr and "{'loss'" not in done.stdout + done.stderr


if __name__ == "__main__":  # the torchrun worker of test_two_ranks_split_a_group_and_stay_consistent
    outcome = train_scripted(sys.argv[1], sys.argv[2], per_device_batch=3)
    Path(sys.argv[2], f"rank{outcome['rank']}.json").write_text(json.dumps(outcome))
