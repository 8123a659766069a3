"""`gym-bridge eval` on the real vLLM engine: against a vLLM OpenAI-compatible server (`--base-url`) and
with a colocated engine (`--backend vllm`), end to end through the CLI, with the embedded model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.invariants import assert_token_invariants
from tests.support.vllm_engine import CPU_ENV, on_gpu

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(600)]  # an engine starts in 15-60 s on 2 busy cores
pytest.importorskip("vllm", reason="needs vLLM (make install puts its CPU build in the suite's virtualenv)")

EVAL = ["--env", "arithmetic", "--limit", "3", "--num-repeats", "2", "--max-new-tokens", "32", "--temperature", "0.7",
        "--seed", "0", "--no-progress", "--max-failure-fraction", "0"]


def run_eval(*args: str, timeout_s: float = 300.0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **CPU_ENV, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "gym_bridge.cli", "eval", *args], capture_output=True, text=True, env=env, timeout=timeout_s)


def check_records(path, *, count):
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == count
    for record in records:
        assert record["failure_kind"] is None, record["failure_reason"]
        assert record["tokens"]["completion_ids"] and all(lp <= 0.0 for lp in record["tokens"]["completion_logprobs"])
        assert_token_invariants(record)
    return records


def test_eval_against_a_vllm_server(vllm_server, tmp_path):
    _, base_url = vllm_server
    output = tmp_path / "served.jsonl"
    result = run_eval("--base-url", base_url, *EVAL, "--output", str(output))
    assert result.returncode == 0, result.stderr[-3000:]
    check_records(output, count=6)
    assert "arithmetic" in result.stdout


@pytest.mark.slow  # about 25 s (a second engine); by default: the colocated engine in test_vllm_real.py, eval above
def test_eval_with_a_colocated_engine(tmp_path):
    output = tmp_path / "colocated.jsonl"
    share = ["--gpu-memory-utilization", "0.3"] if on_gpu() else []  # the session's server may hold 0.3 of the GPU
    result = run_eval("--backend", "vllm", *share, *EVAL, "--output", str(output))
    assert result.returncode == 0, result.stderr[-3000:]
    check_records(output, count=6)
