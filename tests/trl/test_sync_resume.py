"""TRL's synchronous GRPOTrainer with `make_rollout(journal_dir=...)`, restarted from its checkpoint mid-batch.

A real GRPOTrainer on a tiny model saves a checkpoint each step; its scripted policy dies during the second step's
generation (the trainer's process going down: the call raises past every boundary, the calls after it never return).
A new trainer resumed from checkpoint-1 generates the same batch again and continues each rollout from its last
committed turn: the rows are token-identical to the uninterrupted first step's (same rows, same script), and only the
turns not committed are generated. A batch's journal is kept until the next batch, so a restart after a crash in the
optimizer step continues it too; the journal of another step is dropped, not continued.
"""

from __future__ import annotations

import asyncio
import os

import pytest

pytest.importorskip("trl", reason="needs TRL")

from gym_bridge.core.policy import Generation, GenerationRequest  # noqa: E402
from tests.support.resume_kit import Killed, TurnPolicy  # noqa: E402
from tests.support.scripted_model import finished_turns

CALLS = [
    '<tool_call>\n{"name": "get_synonym_value", "arguments": {"synonym": "Warm"}}\n</tool_call>',
    '<tool_call>\n{"name": "get_synonym_value", "arguments": {"synonym": "Blazing"}}\n</tool_call>',
    '<tool_call>\n{"name": "extract_synonym_values", "arguments": {"synonym_values": [407, 711]}}\n</tool_call>',
    "I submitted the values.",
]
ROLLOUTS = 4
"""Per step: two rows, two generations each."""


class DiesAt(TurnPolicy):
    """Raises Killed at call `kill_at`; the calls after it never return (nothing runs in a dead process)."""

    async def generate(self, request: GenerationRequest) -> Generation:
        if self.kill_at is not None and self.calls + 1 > self.kill_at:
            self.calls += 1
            if self.calls == self.kill_at:
                raise Killed()
            await asyncio.Event().wait()
        return await super().generate(request)


def train(model_dir, output_dir, policy, journal_dir, *, resume=None, max_steps=2, end_journal=False, callbacks=()):
    """Train with the rollout function journaling to `journal_dir`; returns the trainer and each batch's records.
    `end_journal`: the journal's `end_callback` registered, as recipes/trl_grpo.py does."""
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    import gym_bridge
    from gym_bridge.core.task import iter_jsonl

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    [path] = gym_bridge.trl.example_data_paths(["multi_step"])
    dataset = gym_bridge.trl.load_dataset([[row for _, row in iter_jsonl(path)][:2]])
    batches = []
    rollout = gym_bridge.trl.make_rollout(policy=policy, journal_dir=str(journal_dir), max_turns=6,
                                          on_records=lambda records: batches.append([record.to_dict() for record in records]))
    args = GRPOConfig(output_dir=str(output_dir), use_cpu=True, use_vllm=False, report_to="none", per_device_train_batch_size=ROLLOUTS,
                      num_generations=2, max_completion_length=512, max_steps=max_steps, learning_rate=1e-3, save_strategy="steps",
                      save_steps=1, logging_steps=1, shuffle_dataset=False, bf16=False, seed=0)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=gym_bridge.trl.env_reward, args=args,
                          train_dataset=dataset, processing_class=tokenizer, rollout_func=rollout, callbacks=list(callbacks))
    if end_journal:
        trainer.add_callback(rollout.prepare(trainer).journal.end_callback())
    try:
        trainer.train(resume_from_checkpoint=resume)
    except Killed:
        pass
    return trainer, batches


def same(record: dict) -> tuple:
    return (record["task_index"], record["repeat_index"], record["tokens"], record["reward"])


def script(tokenizer) -> list[Generation]:
    turns = finished_turns(tokenizer, CALLS)
    return turns


def crash_and_resume(model_dir, template, turns, journal, out) -> list[tuple]:
    """The first trainer dies mid-way through step 2's generation; a second resumes from checkpoint-1. Returns the
    first step's rows, to compare with."""
    per_step = ROLLOUTS * len(CALLS)
    dying = DiesAt(template, turns, kill_at=per_step + 7)  # mid-way through the second step's generation
    crashed, batches = train(model_dir, out, dying, journal)
    assert crashed.state.global_step == 1 and len(batches) == 1 and (out / "checkpoint-1").is_dir()
    first_step = sorted(same(record) for record in batches[0])

    again = TurnPolicy(template, turns)
    resumed, batches = train(model_dir, out, again, journal, resume=True)
    assert resumed.state.global_step == 2 and len(batches) == 1
    records = batches[0]
    assert sorted(same(record) for record in records) == first_step  # token for token as the uninterrupted step
    continued = [record["metrics"].get("resumed_from_turn") or 0 for record in records]
    assert all(turn >= 1 for turn in continued) and all(record["metrics"]["attempts"] == 2 for record in records)
    assert again.calls == per_step - sum(continued)  # no committed turn generated again
    return first_step


def test_a_restarted_sync_trainer_continues_the_batch_in_flight_from_its_last_turns(tiny_model_dir, smol_template, smol_tokenizer, tmp_path):
    crash_and_resume(tiny_model_dir, smol_template, script(smol_tokenizer), tmp_path / "journal", tmp_path / "out")


def test_a_sync_run_that_ends_normally_removes_its_last_batch_journal(tiny_model_dir, smol_template, smol_tokenizer, tmp_path):
    from transformers import TrainerCallback

    journal = tmp_path / "journal"
    held = []

    class Probe(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            held.append(sorted(path.name for path in journal.rglob("*.log")))

    policy = TurnPolicy(smol_template, script(smol_tokenizer))
    trainer, batches = train(tiny_model_dir, tmp_path / "out", policy, journal, max_steps=2, end_journal=True, callbacks=[Probe()])
    assert trainer.state.global_step == 2 and len(batches) == 2
    assert len(held) == 2 and all(held)  # each step's batch journaled, kept past its step (a crash there resumes it)
    assert not journal.exists()  # training ended: nothing left to continue, the journal is gone


@pytest.mark.slow  # about a minute: four trainers; by default: the crash and the resume (test above)
def test_the_batch_journal_outlives_its_step_and_is_dropped_at_another_step(tiny_model_dir, smol_template, smol_tokenizer, tmp_path):
    turns, journal = script(smol_tokenizer), tmp_path / "journal"
    first_step = crash_and_resume(tiny_model_dir, smol_template, turns, journal, tmp_path / "out")

    # the crash comes in step 2's optimizer step instead: its batch, kept until the next batch, is continued whole
    again = TurnPolicy(smol_template, turns)
    _, batches = train(tiny_model_dir, tmp_path / "out2", again, journal, resume=str(tmp_path / "out" / "checkpoint-1"))
    assert sorted(same(record) for record in batches[0]) == first_step
    assert again.calls == ROLLOUTS  # each rollout's last call: an answer is not a turn boundary, so never committed

    # a run at another step does not continue that journal: step 0 is not the step it holds
    again = TurnPolicy(smol_template, turns)
    _, batches = train(tiny_model_dir, tmp_path / "out3", again, journal, max_steps=1)
    assert again.calls == ROLLOUTS * len(CALLS) and not any(record["metrics"].get("resumed_from_turn") for record in batches[0])


@pytest.fixture(scope="module")
def scripted_server(smol_tokenizer):
    """The real `serve-model` app answering turn k of every episode with CALLS[k]; it keeps every request."""
    from gym_bridge.policies.embedded import embedded_model_path
    from gym_bridge.serve.model_server import build_app
    from tests.support.http_server import app_in_thread
    from tests.support.scripted_model import ScriptedModel

    turns = script(smol_tokenizer)

    def answer(prompt_text: str, request: GenerationRequest) -> Generation:
        return turns[min(prompt_text.count("<|im_start|>assistant") - 1, len(turns) - 1)]

    model = ScriptedModel(smol_tokenizer, answer)
    with app_in_thread(build_app(model, model_name="scripted", model_root=str(embedded_model_path()))) as url:
        yield model, f"{url}/v1"


@pytest.mark.slow  # about 20 s: the recipe trains three times; by default: make_rollout(journal_dir=...) above
def test_the_sync_recipe_journals_its_batch_and_resumes_from_its_checkpoint(scripted_server, tiny_model_dir, tmp_path, monkeypatch):
    import importlib.util
    import sys
    from pathlib import Path

    model, url = scripted_server
    repo = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("trl_grpo_recipe", repo / "recipes" / "trl_grpo.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)

    def run(*overrides: str) -> int:
        common = [f"model={tiny_model_dir}", "datasets=[{env: multi_step}]", f"grpo.output_dir={tmp_path}", "grpo.save_strategy=steps",
                  "grpo.save_steps=1", f"grpo.per_device_train_batch_size={ROLLOUTS}", "grpo.gradient_accumulation_steps=1",
                  "grpo.num_generations=2", "grpo.max_completion_length=512", "save_model=false", "gym_bridge.max_turns=6",
                  "gym_bridge.journal=true", f"gym_bridge.generation_server={{base_url: '{url}', model: scripted}}"]
        argv = ["trl_grpo.py", "--config", str(repo / "recipes/configs/trl_grpo_cpu_demo.yaml")] + [f"--set={o}" for o in common + list(overrides)]
        monkeypatch.setattr(sys, "argv", argv)
        before = len(model.requests)
        recipe.main()
        return len(model.requests) - before

    assert run("grpo.max_steps=1") == ROLLOUTS * len(CALLS)
    # the run ended normally: its last batch's journal is removed, so a run started again over the same output
    # generates its batch whole (before the journal's end callback it continued that batch: only the answers again)
    assert not (tmp_path / "rollout_journal").exists() and (tmp_path / "checkpoint-1").is_dir()
    assert run("grpo.max_steps=1", "grpo.save_strategy='no'") == ROLLOUTS * len(CALLS)
    # resumed from checkpoint-1: step 2 only, a batch of another step than the journal's, so generated whole
    assert run("grpo.max_steps=2", "resume_from_checkpoint=true") == ROLLOUTS * len(CALLS)
    assert (tmp_path / "checkpoint-2").is_dir()
