"""The TRL async worker across real trainer restarts: a trainer process (`tests/support/async_trainer.py`, driving
`AsyncRolloutWorker` as TRL's AsyncGRPOTrainer does and checkpointing each step) is killed with SIGKILL at random
moments mid-episode, then started again over the same journal and checkpoint, until it has trained its steps.

Checked against an uninterrupted run: every group trained once, token for token; no committed turn generated again
(the model server counts each group's calls: at most one more per rollout for each kill that cut the group); the turns a resumed
rollout committed before a kill keep the policy versions they were generated with, older than the restarted trainer's.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl.experimental.async_grpo", reason="needs TRL >= 1.16")

from gym_bridge.core.policy import Generation, GenerationRequest  # noqa: E402
from tests.support import async_trainer  # noqa: E402
from tests.support.scripted_model import ScriptedModel  # noqa: E402
from tests.support.scripted_model import finished_turns

REPO = Path(__file__).resolve().parents[2]
STEPS = 8
CALLS = [
    '<tool_call>\n{"name": "get_synonym_value", "arguments": {"synonym": "Warm"}}\n</tool_call>',
    '<tool_call>\n{"name": "get_synonym_value", "arguments": {"synonym": "Blazing"}}\n</tool_call>',
    '<tool_call>\n{"name": "extract_synonym_values", "arguments": {"synonym_values": [407, 711]}}\n</tool_call>',
    "I submitted the values.",
]


class SlowScriptedModel(ScriptedModel):
    """Answers turn k of every episode with CALLS[k] after a few milliseconds, as a loaded server would; logs prompts,
    and in `tasks` the task of each call (its `(request N)` marker: group g runs task g, so the call's group)."""

    tasks: list[int]

    async def generate(self, request: GenerationRequest) -> Generation:
        await asyncio.sleep(0.01)
        return await super().generate(request)


@pytest.fixture(scope="module")
def model_server(smol_tokenizer):
    from gym_bridge.policies.embedded import embedded_model_path
    from gym_bridge.serve.model_server import build_app
    from tests.support.http_server import app_in_thread

    turns = finished_turns(smol_tokenizer, CALLS)

    def answer(prompt_text: str, request: GenerationRequest) -> Generation:
        model.tasks.append(int(re.findall(r"\(request (\d+)\)", prompt_text)[0]))
        return turns[min(prompt_text.count("<|im_start|>assistant") - 1, len(turns) - 1)]

    model = SlowScriptedModel(smol_tokenizer, answer)
    model.tasks = []
    with app_in_thread(build_app(model, model_name="scripted", model_root=str(embedded_model_path()))) as url:
        yield model, f"{url}/v1"


class Trainer:
    """One trainer process: forked from this test process (TRL already imported: fast) or a fresh interpreter."""

    def __init__(self, work: Path, url: str, *, fresh: bool, steps: int) -> None:
        argv = [str(work), url, str(steps)]
        if fresh:
            env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                   "TRL_EXPERIMENTAL_SILENCE": "1"}
            self.popen: subprocess.Popen[bytes] | None = subprocess.Popen([sys.executable, "-m", "tests.support.async_trainer", *argv],
                                                                          cwd=REPO, env=env)
            self.forked = None
        else:
            self.popen = None
            self.forked = multiprocessing.get_context("fork").Process(target=async_trainer.main, args=(argv,), daemon=True)
            self.forked.start()

    def running(self) -> bool:
        return self.popen.poll() is None if self.popen is not None else self.forked.is_alive()

    def kill(self) -> None:
        os.kill(self.popen.pid if self.popen is not None else self.forked.pid, signal.SIGKILL)

    def wait(self, timeout_s: float) -> int | None:
        if self.popen is not None:
            return self.popen.wait(timeout_s)
        self.forked.join(timeout_s)
        return self.forked.exitcode


def run_to_the_end(model_server, work: Path, *, kills: int, seed: int, fresh: bool, steps: int = STEPS) -> dict[str, Any]:
    """Start the trainer over `work` `kills` times, each SIGKILLed after a random number of model calls; then once more
    to the end. Returns its checkpoint, the model calls made for each group, the kills that landed, the groups each killed process
    made calls for, and every process's records."""
    model, url = model_server
    work.mkdir()
    rng, killed, start, cut = random.Random(seed), 0, len(model.requests), []
    for _ in range(kills):
        launched = len(model.requests)
        trainer = Trainer(work, url, fresh=fresh, steps=steps)
        target = launched + rng.randint(8, 48)  # a random moment, in model calls of this process (a group makes 8)
        deadline = time.monotonic() + 120
        while len(model.requests) < target and trainer.running() and time.monotonic() < deadline:
            time.sleep(0.002)
        if trainer.running():
            trainer.kill()
            killed += 1
        trainer.wait(30)
        cut.append(set(model.tasks[launched:]))
    final = Trainer(work, url, fresh=fresh, steps=steps)
    assert final.wait(300) == 0
    records = {}
    for start_line in (work / "starts.jsonl").read_text().splitlines():
        started = json.loads(start_line)
        path = work / f"records-{started['pid']}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        records[started["version"]] = [json.loads(line) for line in lines]
    return {"checkpoint": json.loads((work / "checkpoint.json").read_text()),
            "calls": Counter(model.tasks[start:]), "killed": killed, "cut": cut, "records": records}


def by_group(rows: list[dict[str, Any]]) -> dict[int, list[tuple]]:
    """The rows of each trained group, as comparable tuples."""
    groups: dict[int, list[tuple]] = {}
    for row in rows:
        key = (tuple(row["input_ids"]), tuple(row["completion_mask"]), tuple(round(v, 6) for v in row["old_log_probs"]))
        groups.setdefault(row["group_id"], []).append(key)
    return {group: sorted(keys) for group, keys in groups.items()}


def check(result: dict[str, Any], baseline: dict[str, Any], *, steps: int = STEPS) -> None:
    rows = result["checkpoint"]["rows"]
    assert result["checkpoint"]["step"] == steps and not result["checkpoint"]["dropped"]
    groups = Counter(row["group_id"] for row in rows)
    assert len(groups) == steps and set(groups.values()) == {async_trainer.GROUP_SIZE}  # every group trained once, whole
    expected = by_group(baseline["checkpoint"]["rows"])
    for group, keys in by_group(rows).items():
        assert keys == expected[group]  # token for token as the uninterrupted run
        # no committed turn made again: each kill that cut the group cost at most one call per rollout
        cuts = sum(group in tasks for tasks in result["cut"])
        assert result["calls"][group] <= len(CALLS) * async_trainer.GROUP_SIZE + cuts * async_trainer.GROUP_SIZE, (group, cuts)
    resumed = 0
    for first_version, records in result["records"].items():  # each process: the version of its first weight sync
        for record in records:
            turn = record["metrics"].get("resumed_from_turn") or 0
            versions = [item["policy_version"] for item in record["response"]["output"] if "generation_token_ids" in item]
            assert len(versions) == len(CALLS)
            assert all(v < first_version for v in versions[:turn]) and all(v >= first_version for v in versions[turn:])
            resumed += turn > 0
    assert resumed, "no rollout was resumed mid-episode: the kills missed every episode"


@pytest.fixture(scope="module")
def baseline(model_server, tmp_path_factory):
    result = run_to_the_end(model_server, tmp_path_factory.mktemp("baseline") / "run", kills=0, seed=0, fresh=False, steps=4 * STEPS)
    assert all(result["calls"][row["group_id"]] == len(CALLS) * async_trainer.GROUP_SIZE for row in result["checkpoint"]["rows"])
    return result


def test_a_trainer_process_killed_mid_episode_continues_its_groups_from_their_last_turn(model_server, baseline, tmp_path):
    result = run_to_the_end(model_server, tmp_path / "run", kills=3, seed=31, fresh=False)
    assert result["killed"] >= 2
    check(result, baseline)


@pytest.mark.slow  # 1.5-4 minutes on 2 shared cores: 9 fresh interpreters import TRL; by default: forked processes (test above)
def test_a_trainer_process_killed_many_times_in_fresh_interpreters(model_server, baseline, tmp_path):
    result = run_to_the_end(model_server, tmp_path / "run", kills=8, seed=7, fresh=True, steps=3 * STEPS)
    assert result["killed"] >= 6
    check(result, baseline, steps=3 * STEPS)
