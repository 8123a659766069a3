"""`gym-bridge eval` killed with SIGKILL at random moments, again and again, each time resumed with `--resume`.

The model is a scripted one behind the real `serve-model` app on loopback, which logs every call. The final output
must hold every (task, repeat) exactly once, token for token as an uninterrupted run's, and the kills may cost at
most one extra model call per rollout in flight per kill: no finished (committed) turn is generated twice.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from gym_bridge.core.journal import journal_dir_for
from gym_bridge.core.policy import Generation, GenerationRequest
from gym_bridge.core.rollout_file import read_records
from tests.support.scripted_model import ScriptedModel
from tests.support.scripted_model import finished_turns

REPO = Path(__file__).resolve().parents[2]
CONCURRENCY = 6
CALLS = [
    '<tool_call>\n{"name": "get_synonym_value", "arguments": {"synonym": "Warm"}}\n</tool_call>',
    '<tool_call>\n{"name": "get_synonym_value", "arguments": {"synonym": "Blazing"}}\n</tool_call>',
    '<tool_call>\n{"name": "extract_synonym_values", "arguments": {"synonym_values": [407, 711]}}\n</tool_call>',
    "I submitted the values.",
]


class SlowScriptedModel(ScriptedModel):
    """Answers turn k of every episode with CALLS[k] after `delay_s`, as a loaded server would; logs each prompt."""

    delay_s = 0.01

    async def generate(self, request: GenerationRequest) -> Generation:
        await asyncio.sleep(self.delay_s)
        return await super().generate(request)


@pytest.fixture(scope="module")
def model_server(smol_tokenizer):
    from gym_bridge.policies.embedded import embedded_model_path
    from gym_bridge.serve.model_server import build_app
    from tests.support.http_server import app_in_thread

    turns = finished_turns(smol_tokenizer, CALLS)

    def answer(prompt_text: str, request: GenerationRequest) -> Generation:
        return turns[min(prompt_text.count("<|im_start|>assistant") - 1, len(turns) - 1)]

    model = SlowScriptedModel(smol_tokenizer, answer)
    with app_in_thread(build_app(model, model_name="scripted", model_root=str(embedded_model_path()))) as url:
        yield model, f"{url}/v1"


def eval_command(url: str, output: Path, *, repeats: int, resume: bool, journal: bool | None = True) -> list[str]:
    """The eval command line; `journal=None` passes neither --journal nor --no-journal (the default: on, over a server)."""
    from gym_bridge.policies.embedded import embedded_model_path

    command = [sys.executable, "-m", "gym_bridge", "eval", "--env", "multi_step", "--base-url", url, "--model", "scripted",
               "--tokenizer", str(embedded_model_path()), "--num-repeats", str(repeats), "--concurrency", str(CONCURRENCY),
               "--temperature", "0", "--no-progress", "--output", str(output)]
    return command + (["--resume"] if resume else []) + {True: ["--journal"], False: ["--no-journal"], None: []}[journal]


def environment() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def prompts(model: ScriptedModel, since: int = 0) -> Counter[tuple[int, ...]]:
    return Counter(tuple(request.prompt_ids) for request in model.requests[since:])


def same_rollout(record: dict) -> tuple:
    return (record["tokens"], record["response"]["output"], record["reward"], record["metrics"]["finish_reason"])


def kill_and_resume(model_server, tmp_path: Path, *, kills: int, repeats: int, seed: int, journal: bool = True) -> dict:
    model, url = model_server
    baseline_out = tmp_path / "baseline.jsonl"
    start = len(model.requests)
    done = subprocess.run(eval_command(url, baseline_out, repeats=repeats, resume=False), env=environment(), cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    baseline_prompts = prompts(model, start)
    baseline = {(r["task_index"], r["repeat_index"]): r for r in read_records(baseline_out)}

    output, rng, killed = tmp_path / "killed.jsonl", random.Random(seed), 0
    start = len(model.requests)
    for attempt in range(kills):
        launched = len(model.requests)
        process = subprocess.Popen(eval_command(url, output, repeats=repeats, resume=attempt > 0, journal=journal),
                                   env=environment(), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        target = launched + rng.randint(1, 3 * CONCURRENCY)  # a random moment, counted in model calls of this process
        deadline = time.monotonic() + 120
        while len(model.requests) < target and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            killed += 1
        process.wait(30)
        process.stderr.close()
    final = subprocess.run(eval_command(url, output, repeats=repeats, resume=True, journal=journal), env=environment(),
                           cwd=REPO, capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stderr[-3000:]
    return {"baseline": baseline, "baseline_prompts": baseline_prompts, "records": read_records(output),
            "prompts": prompts(model, start), "killed": killed, "output": output}


def check(result: dict, repeats: int) -> None:
    records, baseline = result["records"], result["baseline"]
    keys = [(r["task_index"], r["repeat_index"]) for r in records]
    assert sorted(keys) == sorted(baseline) and len(keys) == len(set(keys)) == 8 * repeats  # each exactly once
    for record in records:
        assert same_rollout(record) == same_rollout(baseline[(record["task_index"], record["repeat_index"])])
    extra = result["prompts"] - result["baseline_prompts"]
    assert sum(extra.values()) <= result["killed"] * CONCURRENCY, (result["killed"], sum(extra.values()))
    assert not journal_dir_for(result["output"]).exists()  # every rollout finished: the journal is gone
    resumed = [r for r in records if r["metrics"].get("resumed_from_turn")]
    assert resumed, "no rollout was resumed mid-episode: the kills missed every episode"


def test_eval_killed_at_random_moments_resumes_every_rollout_exactly_once_without_redoing_turns(model_server, tmp_path):
    result = kill_and_resume(model_server, tmp_path, kills=4, repeats=2, seed=31)
    assert result["killed"] >= 3
    check(result, repeats=2)


@pytest.mark.slow  # about 40 s; by default: the 4-kill run above
def test_eval_killed_many_times_under_load(model_server, tmp_path):
    result = kill_and_resume(model_server, tmp_path, kills=20, repeats=6, seed=7)
    assert result["killed"] >= 15
    check(result, repeats=6)


def test_eval_over_a_server_journals_by_default_so_resume_continues_with_no_flag_and_refuses_other_repeats(model_server, tmp_path):
    # before: without --journal nothing was journaled (every episode in flight started over), and a --resume that
    # forgot --num-repeats exited 0, dropped the journal's repeats and left the groups uneven (issue 36 item 12)
    model, url = model_server
    output = tmp_path / "out.jsonl"
    launched = len(model.requests)
    process = subprocess.Popen(eval_command(url, output, repeats=2, resume=False, journal=None), env=environment(), cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while len(model.requests) < launched + 2 * CONCURRENCY and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    assert process.poll() is None, "the run ended before it was killed"
    process.send_signal(signal.SIGKILL)
    process.wait(30)
    assert journal_dir_for(output).exists()

    refused = subprocess.run(eval_command(url, output, repeats=1, resume=True, journal=None), env=environment(), cwd=REPO,
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert ("setting num_repeats (journal: 2, this run: 1)" in refused.stderr
            or "--num-repeats 2 or more, and this run has --num-repeats 1" in refused.stderr), refused.stderr[-3000:]
    assert journal_dir_for(output).exists()

    final = subprocess.run(eval_command(url, output, repeats=2, resume=True, journal=None), env=environment(), cwd=REPO,
                           capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stderr[-3000:]
    records = read_records(output)
    assert sorted((r["task_index"], r["repeat_index"]) for r in records) == [(task, repeat) for task in range(8) for repeat in range(2)]
    assert any(r["metrics"].get("resumed_from_turn") for r in records), "no episode continued mid-way"
    assert not journal_dir_for(output).exists()


def test_run_eval_journals_only_when_asked_and_a_resume_uses_the_journal_left(tmp_path, smol_template, smol_tokenizer):
    from gym_bridge.core.engine import Engine, EngineConfig
    from gym_bridge.eval.run import run_eval, select_tasks
    from tests.support.resume_kit import Killed, TurnPolicy

    tasks = select_tasks(env_names=["multi_step"], limit=2)
    script = finished_turns(smol_tokenizer, CALLS)

    def killed_run(output: Path, **options) -> None:
        engine = Engine(TurnPolicy(smol_template, script, kill_at=6), smol_template, EngineConfig())
        with pytest.raises(Killed):
            asyncio.run(run_eval(engine, tasks, output=output, **options))

    killed_run(tmp_path / "default.jsonl")
    assert not journal_dir_for(tmp_path / "default.jsonl").exists()  # off unless asked: nothing written
    killed_run(tmp_path / "journaled.jsonl", journal=True)
    assert journal_dir_for(tmp_path / "journaled.jsonl").exists()
    policy = TurnPolicy(smol_template, script)
    result = asyncio.run(run_eval(Engine(policy, smol_template, EngineConfig()), tasks, output=tmp_path / "journaled.jsonl", resume=True))
    records = read_records(result.output)
    assert len(records) == 2 and all(record["metrics"]["attempts"] == 2 for record in records)
    assert policy.calls == 8 - sum(record["metrics"]["resumed_from_turn"] for record in records)
    assert not journal_dir_for(tmp_path / "journaled.jsonl").exists()
