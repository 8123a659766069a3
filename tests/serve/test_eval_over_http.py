"""`gym-bridge serve-model` in a subprocess with `gym-bridge eval --base-url` against it: records whose
token fields come from the server, sampling parity with the local transformers policy, and a server
killed mid-run (bounded `infra` failures, then `--resume` completes)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest

from gym_bridge.cli import main
from gym_bridge.core.policy import GenerationRequest, SamplingParams
from gym_bridge.core.rollout_file import read_records
from gym_bridge.policies.remote import RemotePolicy
from gym_bridge.policies.transformers import TransformersPolicy
from gym_bridge.serve.model_server import build_app
from tests.support.http_server import ServeModelProcess, app_in_thread
from tests.support.invariants import assert_token_invariants

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def embedded_server():
    server = ServeModelProcess()
    try:
        yield server
    finally:
        server.stop()


def test_eval_against_serve_model_records_the_server_s_tokens(embedded_server, tmp_path, capsys):
    output = tmp_path / "out.jsonl"
    before = embedded_server.health()["generations"]
    # a timeout no busy machine reaches: a retried request would be generated twice and spoil the count below
    code = main(["eval", "--env", "math", "--limit", "2", "--base-url", embedded_server.url, "--max-new-tokens", "48", "--request-timeout-s", "900",
                 "--seed", "0", "--no-progress", "--output", str(output)])
    assert code == 0, capsys.readouterr()
    records = read_records(output)
    assert len(records) == 2
    model_calls = 0
    for record in records:
        assert record["failure_kind"] is None, record["failure_reason"]
        assert record["response"]["model"] == "SmolLM2-135M-Instruct"
        assert sum(record["tokens"]["completion_mask"]) > 0
        assert_token_invariants(record)
        model_calls += sum("generation_token_ids" in item for item in record["response"]["output"])
    assert embedded_server.health()["generations"] - before == model_calls  # every model call was served


def test_sampling_parity_between_the_local_and_the_remote_policy(embedded_server, smol_template):
    local = TransformersPolicy.from_pretrained(None, device="cpu")
    remote = RemotePolicy(embedded_server.url, model="SmolLM2-135M-Instruct", request_timeout_s=60)
    prompts = [smol_template.prompt_ids([{"role": "user", "content": text}], None)
               for text in ("What is 2+2?", "Write a haiku about rain.")]
    settings = [SamplingParams(temperature=0.0, max_new_tokens=16),
                SamplingParams(temperature=0.8, top_p=0.9, top_k=20, seed=5, max_new_tokens=12, logprobs_mode="processed")]

    async def run(policy):
        out = [await policy.generate(GenerationRequest(prompt_ids=prompt, sampling=sampling))  # one at a time on both sides
               for sampling in settings for prompt in prompts]
        if hasattr(policy, "aclose"):
            await policy.aclose()
        return out

    mine, theirs = asyncio.run(run(local)), asyncio.run(run(remote))
    local.close()
    for a, b in zip(mine, theirs):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert a.finish_reason == b.finish_reason


@pytest.mark.slow  # about 12-15 s; by default: a replica killed mid-run (policies/test_router.py), --resume (cli/test_hardening.py)
def test_a_killed_server_gives_bounded_infra_failures_and_resume_completes(tiny_model_dir, tmp_path):
    output = tmp_path / "rollouts.jsonl"
    server = ServeModelProcess("--model", str(tiny_model_dir))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    args = [sys.executable, "-m", "gym_bridge.cli", "eval", "--env", "weather", "--num-repeats", "3", "--max-new-tokens", "16",
            "--max-turns", "2", "--concurrency", "2", "--request-timeout-s", "20", "--max-retries", "1", "--no-progress",
            "--output", str(output)]
    try:
        run = subprocess.Popen([*args, "--base-url", server.url], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (not output.exists() or len(read_records(output)) < 3):
            time.sleep(0.05)
        server.kill()
        killed_at = time.monotonic()
        stdout, stderr = run.communicate(timeout=60)
        # the rest of 24 rollouts, 2 at a time, each failing after 2 refused connections (or one reset and a
        # refused one for the calls in flight at the kill): seconds, not a hang
        assert time.monotonic() - killed_at < 30, time.monotonic() - killed_at
    finally:
        server.stop()
    assert run.returncode == 3, stderr  # more than --max-failure-fraction failed (exit code 3)
    records = read_records(output)
    failed = [record for record in records if record["failure_kind"] is not None]
    assert len(records) == 24 and failed and all(record["failure_kind"] == "infra" for record in failed)
    assert all("generation backend" in record["failure_reason"] for record in failed)
    assert "infra=" in stdout
    kept = {(r["task_index"], r["repeat_index"]): r for r in records if r["failure_kind"] is None}
    assert len(kept) >= 3

    policy = TransformersPolicy.from_pretrained(tiny_model_dir, device="cpu")
    with app_in_thread(build_app(policy, model_name=str(tiny_model_dir), model_root=str(tiny_model_dir))) as url:
        code = main([*args[3:], "--base-url", url, "--resume", "--request-timeout-s", "120"])
    records = read_records(output)
    assert code == 0, [record["failure_reason"] for record in records if record["failure_kind"]]
    assert sorted((r["task_index"], r["repeat_index"]) for r in records) == [(t, r) for t in range(8) for r in range(3)]
    assert all(record["failure_kind"] is None for record in records)
    for record in records:
        assert_token_invariants(record)
        key = (record["task_index"], record["repeat_index"])
        if key in kept:  # finished before the kill: kept, not rerun
            assert json.dumps(record["tokens"]) == json.dumps(kept[key]["tokens"])
