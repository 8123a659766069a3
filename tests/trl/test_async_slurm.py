"""slurm/trl_async_grpo.sbatch on the one-host Slurm cluster (../shared/slurm/cluster.sh, see tests/test_slurm_cluster.py):
submitted with `sbatch` as a user would, the vLLM CPU server on one node (with a memory fraction that fits beside
other jobs), TRL's AsyncGRPOTrainer with gym_bridge's worker on the other, the weights through a file under the run's
output folder on the shared file system. `slurm` marker (`make test-slurm`, as root)."""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.test_slurm_cluster import CPU_VLLM_ARGS, ROOT, job_env, records_of, slurm, submit  # noqa: F401 (slurm: the fixture)

pytestmark = pytest.mark.timeout(1500)


@pytest.mark.slurm
def test_trl_async_grpo_trains_on_one_node_against_the_vllm_cpu_server_on_another(slurm, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    extra = (f"--set async_grpo.output_dir={out} --set async_grpo.max_steps=2 --set async_grpo.per_device_train_batch_size=4 "
             "--set async_grpo.max_completion_length=32 --set gym_bridge.max_turns=2 --set gym_bridge.max_completion_tokens=96")
    env = job_env(ROOT, GPUS_PER_NODE="0", CONFIG="recipes/configs/trl_async_grpo_cpu.yaml", VLLM_ARGS=CPU_VLLM_ARGS,
                  VLLM_CPU_KVCACHE_SPACE="1", EXTRA_ARGS=extra)
    started = time.monotonic()
    rc, log = submit(ROOT, env, "--gpus-per-node=0", "--nodes=2", "slurm/trl_async_grpo.sbatch", timeout_s=1200)
    print(f"trl_async_grpo.sbatch: {time.monotonic() - started:.0f} s")
    assert rc == 0, log
    assert re.search(r"^trainer: n1 \(1 processes, 0 GPUs\); vLLM: http://10\.250\.0\.12:8000 serving \S+ "
                     r"\(weights: file, memory fraction 0\.3\)$", log, re.MULTILINE), log
    assert re.search(r"^trained 2 steps; worker: ", log, re.MULTILINE), log
    # the start-up check and one load per sync (the first one and one per step) reached FileWeightReceiver on n2
    assert log.count('"POST /collective_rpc HTTP/1.1" 200') >= 4, log
    assert not list((out / "weights").glob("*.safetensors*")), "a weights file was left behind"
    trained = [record for record in records_of(out / "rollouts.jsonl") if "consumed_version" in record["metrics"]]
    assert len(trained) >= 8 and all(record["tokens"]["completion_ids"] for record in trained)
    versions = {json.dumps(record["metrics"]["consumed_version"]) for record in trained}
    assert versions >= {"1", "2"}, versions  # rows taken before and after the first step's weights reached the server
