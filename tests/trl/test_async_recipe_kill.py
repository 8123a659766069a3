"""recipes/trl_async_grpo.py as a real process, SIGKILLed and restarted: the real TRL AsyncGRPOTrainer (its CPU config
on a tiny model) against the vLLM stand-in served from this test process, journaling and saving a checkpoint each
step. The test polls the output folder until a checkpoint is saved (its worker state written last) and the journal
holds committed turns of a group that checkpoint does not cover, kills the trainer there, and restarts it with
`resume_from_checkpoint: true` (the latest whole checkpoint: a later one cut off mid-save is skipped).

Checked, from the stand-in's log of every model call (each attributed to its group: group g runs task g, and the
run stays under one pass over the 24 tasks), the records in `rollouts.jsonl` and the checkpoints' worker states:
- every group trained once: none that the resumed checkpoint covers is taken again after the restart, each group the
  restarted run's checkpoints add was taken whole (all its rollouts) in that run, and no row was dropped as stale
  (the restart's log history), so the groups covered are the groups trained;
- the rollouts the journal held at the kill continue from their last committed turn (`resumed_from_turn` is the
  journal's turn count), and the restarted run generates only the turns after it: for every group it trains, its
  model calls per turn are exactly those its records did not resume; over both runs a group makes at most one call
  per rollout more than its records hold, and a group the kill did not cut makes none more;
- the committed turns keep the policy versions they were generated with (the journal's, older than the restart's).
Not measurable through the recipe: a rollout's calls one by one (a group's rollouts send identical prompts, so calls are
counted per group and turn, and the bound is per group: at most group size more), and the trained rows' tokens
(the trainer's batches stay in its process; the stand-in trainer's test, test_async_trainer_restart.py, compares them).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl.experimental.async_grpo", reason="needs TRL >= 1.16")

from gym_bridge.core.journal import read_frames  # noqa: E402
from gym_bridge.trl._async.checkpoint import STATE_FILE  # noqa: E402
from gym_bridge.trl._async.ledger import WorkerState  # noqa: E402
from tests.support.http_server import app_in_thread  # noqa: E402
from tests.support.vllm_async_stand_in import AsyncVLLMStandIn  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "recipes" / "configs" / "trl_async_grpo_cpu.yaml"
GROUP_SIZE = 4
STEPS = 6


class LoggingStandIn(AsyncVLLMStandIn):
    """The stand-in, keeping the decoded prompt of every model call in order."""

    def __init__(self, tokenizer: Any, **kwargs: Any) -> None:
        super().__init__(tokenizer, **kwargs)
        self.prompts: list[str] = []

    def answer(self, prompt_ids: list[int]) -> str:
        self.prompts.append(self.tokenizer.decode(prompt_ids))
        return super().answer(prompt_ids)


def launch(output: Path, url: str, model: Path, *extra: str, processes: int = 1) -> subprocess.Popen[bytes]:
    """The recipe as a process; with `processes` 2, under `accelerate launch --multi_gpu` on the CPU (the config's
    `use_cpu`; accelerate's `--cpu` launches one process unless mpirun is there), two trainer ranks over gloo, each
    taking half of a step's GROUP_SIZE rows, so a step still trains one group."""
    overrides = [f"model={model}", f"server.url={url}", "server.launch=false", "server.served_model=stub",
                 f"async_grpo.output_dir={output}", f"async_grpo.per_device_train_batch_size={GROUP_SIZE // processes}",
                 "async_grpo.max_completion_length=48",
                 "async_grpo.save_strategy=steps", "async_grpo.save_steps=1", f"async_grpo.max_steps={STEPS}",
                 "async_grpo.max_staleness=4", "gym_bridge.journal=true", *extra]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, str(REPO / "recipes" / "trl_async_grpo.py"), "--config", str(CONFIG)] + [f"--set={o}" for o in overrides]
    log = (output.parent / f"{output.name}-{len(list(output.parent.glob('*.log')))}.log").open("wb")
    if processes > 1:
        command[1:1] = ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes), "--num_machines", "1",
                        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port())]
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)


def kill_job(trainer: subprocess.Popen[bytes]) -> None:
    """SIGKILL the whole job at once: the recipe and, under `accelerate launch`, every rank (torchrun starts each rank
    in a session of its own, so the launcher's process group does not hold them)."""
    import psutil

    try:
        processes = [psutil.Process(trainer.pid), *psutil.Process(trainer.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        processes = []
    for process in processes:
        try:
            process.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    trainer.wait(60)
    psutil.wait_procs(processes[1:], timeout=60)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def saved_checkpoints(output: Path) -> list[tuple[int, Path]]:
    """The complete checkpoints (the worker state is written last, after TRL's files), by step."""
    found = [(int(path.name.split("-")[1]), path) for path in output.glob("checkpoint-*") if (path / STATE_FILE).exists()]
    return sorted(found)


def journal_in_flight(output: Path) -> dict[tuple[int, int], list[int]]:
    """The rollouts the journal holds committed turns of and no `done` for: (group, repeat) -> the policy version of
    each committed model call."""
    events: dict[tuple[int, int], list[dict[str, Any]]] = {}
    done: set[tuple[int, int]] = set()
    for journal_file in sorted((output / "rollout_journal").rglob("*.log")):
        for frame in list(read_frames(journal_file))[1:]:
            key = (int(frame["r"][0]), int(frame["r"][1]))
            if frame["k"] == "done":
                done.add(key)
            elif frame["k"] == "commit":
                events[key] = events.get(key, [])[:int(frame["at"])] + list(frame["ev"])
    return {key: [event.get("pv") for event in evs if event["t"] == "model"] for key, evs in events.items() if key not in done}


def state(folder: Path) -> WorkerState:
    return WorkerState.from_dict(json.loads((folder / STATE_FILE).read_text()))


def versions(record: dict[str, Any]) -> list[int]:
    return [item["policy_version"] for item in record["response"]["output"] if "generation_token_ids" in item]


@pytest.fixture(scope="module")
def task_texts():
    """The last user message of each task the recipe trains on, by task index (the recipe's shuffle, seed 0), and the
    assistant messages its prompt holds before the first call (arithmetic's few-shot example)."""
    spec = importlib.util.spec_from_file_location("trl_async_grpo_recipe", REPO / "recipes" / "trl_async_grpo.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    tasks = recipe.load_rows([{"env": "arithmetic"}, {"env": "weather"}], CONFIG.parent, 0)
    texts = [str(task.messages[-1]["content"]) for task in tasks]
    assert all(sum(a in b for b in texts) == 1 for a in texts)  # no task's text holds another's: a prompt names its task
    return texts, [sum(message["role"] == "assistant" for message in task.messages) for task in tasks]


def group_of(prompt: str, texts: list[str]) -> int:
    [group] = [index for index, text in enumerate(texts) if text in prompt]
    return group


@pytest.mark.slow  # 1-3 minutes on 2 shared cores: two trainer processes import TRL; by default: the same resume run
# in-process (test_async_recipe_resume.py) and a stand-in trainer process SIGKILLed (test_async_trainer_restart.py)
@pytest.mark.parametrize("processes", [1, 2], ids=["one_rank", "two_ranks"])
def test_the_async_recipe_killed_mid_episode_resumes_each_group_once_from_its_last_turn(tmp_path, tiny_model_dir, smol_tokenizer,
                                                                                          task_texts, processes):
    task_texts, shots = task_texts
    output = tmp_path / "out"
    stand_in = LoggingStandIn(smol_tokenizer, token_delay_s=0.02)  # a weather call takes ~0.5 s: episodes in flight at a save
    with app_in_thread(stand_in.app) as url:
        trainer = launch(output, url, tiny_model_dir, processes=processes)
        deadline, cut = time.monotonic() + 300, None
        try:
            while time.monotonic() < deadline and trainer.poll() is None:
                checkpoints = saved_checkpoints(output)
                if checkpoints and (output / "rollout_journal").is_dir():
                    covered = state(checkpoints[-1][1])
                    if any(pvs and not covered.covers(group) for (group, _), pvs in journal_in_flight(output).items()):
                        cut = checkpoints[-1][0]
                        break
                time.sleep(0.05)
        finally:
            kill_job(trainer)
        assert cut is not None, f"the trainer exited ({trainer.returncode}) or ran 300 s without a checkpoint and a group in flight"
        calls_before = len(stand_in.prompts)
        step, resumed_from = saved_checkpoints(output)[-1]  # a later one may have been saved between the poll and the kill
        assert step < STEPS - 1, "the kill came too late to leave steps to train after the restart"
        saved = state(resumed_from)
        in_flight = {key: pvs for key, pvs in journal_in_flight(output).items() if not saved.covers(key[0])}
        assert any(in_flight.values()), "no rollout had a committed turn at the kill"
        records_text = (output / "rollouts.jsonl").read_text()
        assert records_text.endswith("\n")  # no torn record
        first_lines = len(records_text.splitlines())

        trainer = launch(output, url, tiny_model_dir, "resume_from_checkpoint=true", processes=processes)  # the latest whole checkpoint
        try:
            assert trainer.wait(300) == 0, "the restarted trainer failed; see its log next to the output folder"
        finally:
            kill_job(trainer)

    if processes > 1:  # both ranks trained every step; only rank 0's worker generated (TRL hands other ranks no worker)
        finished = [line for line in (output.parent / f"{output.name}-1.log").read_text().splitlines() if line.startswith(f"trained {STEPS} steps")]
        assert len(finished) == processes and sum(line.endswith("worker: {}") for line in finished) == processes - 1, finished
    restarted = saved.model_version + 1  # the restart's first weight sync
    final = state(output / f"checkpoint-{STEPS}")
    # one pass over the tasks, so group g is task g: the groups trained, and the few the worker runs ahead of them
    # (max_staleness 4, one group a step), stay below the 24 tasks
    assert final.next_group + len(final.taken_after) + 8 < len(task_texts)
    history = json.loads((output / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())["log_history"]
    assert not any("sample/dropped_stale_total" in entry for entry in history)  # rows taken are rows trained

    # every group trained once: those the checkpoint covered never again, the new ones whole, in the restarted run
    later = [json.loads(line) for line in (output / "rollouts.jsonl").read_text().splitlines()[first_lines:]]
    taken_again = Counter(record["task_index"] for record in later if "consumed_version" in record["metrics"])
    groups = range(len(task_texts))
    old = {group for group in groups if saved.covers(group)}
    new = {group for group in groups if final.covers(group)} - old
    assert old and new and len(old) + len(new) == STEPS  # one group of 4 rows per step, no rollout failed
    assert not old & set(taken_again), "a group the checkpoint covered was taken again"
    assert all(taken_again[group] == GROUP_SIZE for group in new)
    for group in new:
        assert sorted(r["repeat_index"] for r in later if r["task_index"] == group) == list(range(GROUP_SIZE))

    # the journal's rollouts continue from their last committed turn, keeping those turns' versions
    resumed = 0
    for record in later:
        key = (record["task_index"], record["repeat_index"])
        committed = in_flight.get(key, [])
        turn = record["metrics"].get("resumed_from_turn") or 0
        assert turn == len(committed), (key, turn, committed)
        assert versions(record)[:turn] == committed and all(v < restarted for v in committed)
        assert all(v >= restarted for v in versions(record)[turn:])
        resumed += turn > 0
    assert resumed, "no rollout continued mid-episode"

    # model calls: the restarted run generates only the turns not committed; one kill costs at most one call per rollout
    calls: dict[int, list[Counter[int]]] = {}
    for index, prompt in enumerate(stand_in.prompts):
        group = group_of(prompt, task_texts)
        per_run = calls.setdefault(group, [Counter(), Counter()])
        per_run[index >= calls_before][prompt.count("<|im_start|>assistant") - 1 - shots[group]] += 1
    for group in old:
        assert not calls.get(group, [Counter(), Counter()])[1], f"group {group}, covered by the checkpoint, generated again"
    for group in new:
        mine = [record for record in later if record["task_index"] == group]
        needed = Counter(t for r in mine for t in range((r["metrics"].get("resumed_from_turn") or 0), len(versions(r))))
        before, after = calls.get(group, [Counter(), Counter()])
        assert after == needed, (group, after, needed)
        extra = sum(before.values()) + sum(after.values()) - sum(len(versions(r)) for r in mine)
        cut_here = bool(before)
        assert 0 <= extra <= (GROUP_SIZE if cut_here else 0), (group, extra)
