"""The sbatch scripts on a real Slurm cluster: three nodes on this one host (../shared/slurm/cluster.sh:
munged, slurmctld and three slurmd, each node in its own network, UTS, mount and PID namespaces, the file
system shared). Each script is submitted with `sbatch` from a checkout as a user would, with environment
variables and command-line options only. `slurm` marker: `make test-slurm` (as root; it brings the
cluster up and down). The fast checks of the same scripts are in tests/test_slurm_scripts.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.support.invariants import assert_token_invariants

pytestmark = pytest.mark.timeout(1200)
# One run is in the default suite (about a minute: the cluster up, ray_cluster.sbatch's eval across two nodes, down);
# every other test here is `slurm` (`make test-slurm`).

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = Path(os.environ.get("GYM_BRIDGE_SLURM_CLUSTER") or ROOT.parent / "shared" / "slurm" / "cluster.sh")
CPU_VLLM_ARGS = "--dtype float32 --enforce-eager --max-model-len 1024 --no-enable-chunked-prefill --seed 0"


def cluster(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """`cluster.sh ARGS...` (`run CMD` runs CMD on the login node, in `cwd`)."""
    return subprocess.run([str(CLUSTER), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)


@pytest.fixture(scope="module")
def slurm():
    if not CLUSTER.is_file():
        pytest.skip(f"no one-host Slurm cluster script at {CLUSTER} (../shared/slurm/cluster.sh beside the checkout, "
                    "or GYM_BRIDGE_SLURM_CLUSTER)")
    if os.geteuid() != 0:
        pytest.skip("the one-host Slurm cluster needs root (network namespaces, slurmd)")
    if shutil.which("sbatch") is None and shutil.which("apt-get") is None:
        pytest.skip("Slurm is not installed and there is no apt-get: install slurm-wlm and munge")
    up = cluster("up", env={**os.environ, "NODES": "3"}, timeout_s=300)
    assert up.returncode == 0, up.stderr
    try:
        yield
    finally:
        down = cluster("down", timeout_s=180)
        assert down.returncode == 0, down.stderr


def job_env(checkout: Path, **extra: str) -> dict[str, str]:
    """The submitting user's environment: this interpreter's virtualenv first on PATH, the checkout's code
    importable, the embedded model's cache, no Slurm or GYM_BRIDGE_DIR left over."""
    from gym_bridge.policies.embedded import cache_root

    env = {key: value for key, value in os.environ.items() if not key.startswith(("SLURM_", "GYM_BRIDGE_DIR", "RAY_"))}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}", PYTHONPATH=str(checkout),
               HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", GYM_BRIDGE_CACHE=str(cache_root()))
    if (Path(sys.prefix) / "bin" / "activate").is_file():
        env["GYM_BRIDGE_VENV"] = sys.prefix
    env.update(extra)
    return env


def submit(checkout: Path, env: dict[str, str], *sbatch_args: str, timeout_s: float = 600) -> tuple[int, str]:
    """`sbatch --wait ARGS` from `checkout`; returns the job's exit code and its log (logs/NAME-ID.out)."""
    done = cluster("run", "sbatch", "--parsable", "--wait", *sbatch_args, cwd=checkout, env=env, timeout_s=timeout_s)
    job_id = done.stdout.split()[0].split(";")[0]
    [log] = (checkout / "logs").glob(f"*-{job_id}.out")
    return done.returncode, log.read_text(errors="replace")


def records_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_every_rollout_once(records: list[dict], *, expected: int) -> None:
    keys = Counter((record["env"], record["task_index"], record["repeat_index"]) for record in records)
    assert len(keys) == expected and set(keys.values()) == {1}, keys
    for record in records:
        assert record["failure_kind"] is None and record["reward"] == 1.0, record["failure_reason"]
        assert_token_invariants(record)


@pytest.fixture(scope="class")  # cancelled after the Ray tests: the TRL job needs all three nodes
def stub_url(slurm, tmp_path_factory):
    """The scripted stand-in for `vllm serve` (benchmarks/stub_server.py: vLLM's wire format, every weather and
    multi_step rollout earns 1, 0.2 s per answer) as a Slurm job on n3; its base URL."""
    out = tmp_path_factory.mktemp("stub")
    started = cluster("run", "sbatch", "--parsable", "--nodelist=n3", "--nodes=1", "--job-name=stub", f"--output={out}/stub-%j.out",
                      "--wrap", "exec python benchmarks/stub_server.py --host 0.0.0.0 --port 8000 --delay-s 0.2",
                      env=job_env(ROOT))
    job_id = started.stdout.strip()
    deadline = time.monotonic() + 180
    while cluster("on", "n1", "curl", "-sf", "http://n3:8000/health").returncode != 0:
        assert time.monotonic() < deadline, "the stub server on n3 did not answer within 180 s:\n" + "".join(
            p.read_text() for p in out.glob("stub-*.out"))
        time.sleep(2)
    yield "http://n3:8000/v1"
    cluster("run", "scancel", job_id)


class TestRayCluster:
    """ray_cluster.sbatch on n1 + n2 running `gym-bridge eval --ray`; the model is the scripted stand-in for
    `vllm serve` (benchmarks/stub_server.py: vLLM's wire format, every weather/multi_step rollout earns 1)
    on n3, itself a Slurm job."""

    def test_eval_across_two_nodes_from_a_fresh_clone_with_a_stale_ray_token(self, stub_url, tmp_path):
        """A fresh `git clone` (logs/ comes from git: sbatch opens the log before the script runs), and a home
        whose ~/.ray/auth_token an earlier local ray.init() left: with it `ray start --head` turned token auth
        on and every worker and driver was refused."""
        checkout = tmp_path / "gym_bridge"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(checkout)], check=True)
        home = tmp_path / "home"
        (home / ".ray").mkdir(parents=True)
        (home / ".ray" / "auth_token").write_text("a-token-an-earlier-local-ray-init-wrote")
        output = tmp_path / "eval.jsonl"
        started = time.monotonic()
        rc, log = submit(checkout, job_env(checkout, HOME=str(home)), "slurm/ray_cluster.sbatch",
                         "gym-bridge", "eval", "--env", "weather", "--env", "multi_step", "--limit", "4", "--num-repeats", "2",
                         "--base-url", stub_url, "--ray", "auto", "--ray-workers", "2", "--output", str(output))
        print(f"ray_cluster.sbatch eval: {time.monotonic() - started:.0f} s")
        assert rc == 0, log
        assert re.search(r"^ray: 2 nodes joined", log, re.MULTILINE), log
        assert re.search(r"ray: 2 workers for .+ on 2 node\(s\)", log), log
        assert_every_rollout_once(records_of(output), expected=16)
        assert "exited unexpectedly" not in log and len(log.splitlines()) < 120, log  # no raylet dumps at shutdown

    @pytest.mark.slurm
    def test_a_worker_node_killed_mid_run_loses_nothing(self, stub_url, tmp_path):
        """The Ray worker step on n2 is cancelled (scancel JOB.STEP) once the first records are written: its
        groups run again on the head node, and every rollout is in the output once."""
        output = tmp_path / "eval.jsonl"
        env = job_env(ROOT)
        submitted = cluster("run", "sbatch", "--parsable", "slurm/ray_cluster.sbatch", "gym-bridge", "eval", "--env", "weather",
                            "--env", "multi_step", "--limit", "4", "--num-repeats", "4", "--concurrency", "2",
                            "--base-url", stub_url, "--ray", "auto", "--ray-workers", "2", "--ray-max-retries", "3",
                            "--output", str(output), env=env)
        job_id = submitted.stdout.strip()
        deadline = time.monotonic() + 300
        while not (output.is_file() and output.read_text().count("\n") >= 2):
            assert time.monotonic() < deadline, "no records within 300 s"
            time.sleep(0.5)
        steps = cluster("run", "squeue", "--steps", f"--jobs={job_id}", "--noheader", "--format=%i %j %N").stdout.split("\n")
        [worker_step] = [line.split()[0] for line in steps if " ray-worker " in f"{line} "]
        written_before = output.read_text().count("\n")
        assert cluster("run", "scancel", worker_step).returncode == 0
        while cluster("run", "squeue", "--noheader", f"--jobs={job_id}").stdout.strip():
            assert time.monotonic() < deadline, "the job did not end within 300 s"
            time.sleep(1)
        state = cluster("run", "scontrol", "show", "job", job_id).stdout
        [log] = (ROOT / "logs").glob(f"*-{job_id}.out")
        text = log.read_text(errors="replace")
        assert "ExitCode=0:0" in state, text
        assert written_before < 32, "the worker was killed after the run ended"
        assert_every_rollout_once(records_of(output), expected=32)


@pytest.mark.slurm
def test_trl_grpo_trains_as_one_job_on_two_nodes_and_stops_at_cpu_weight_sync(slurm, tmp_path):
    """trl_grpo.sbatch on a CPU cluster: the vLLM CPU server on n3 comes up, the trainers on n1 and n2 form one
    process group (rank 0 and rank 1 of 2, checked by the recipe), and TRL 1.16's server mode stops where it
    syncs weights: its NCCL weight-transfer engine needs CUDA. The job ends with the failing step, no hang."""
    env = job_env(ROOT, GPUS_PER_NODE="0", CONFIG="recipes/configs/trl_grpo_cpu_demo.yaml", VLLM_ARGS=CPU_VLLM_ARGS,
                  VLLM_CPU_KVCACHE_SPACE="1", EXTRA_ARGS=f"--set grpo.max_steps=1 --set grpo.output_dir={tmp_path}/out")
    started = time.monotonic()
    rc, log = submit(ROOT, env, "--gpus-per-node=0", "slurm/trl_grpo.sbatch", timeout_s=900)
    print(f"trl_grpo.sbatch: {time.monotonic() - started:.0f} s")
    assert rc == 1, log  # the failing rank's exit code, not srun's 143 for the rank it then ended
    assert re.search(r"^rank [01] failed first, with exit code 1 \(the job step ended with \d+\)$", log, re.MULTILINE), log
    assert re.search(r"^trainers: n1,n2 \(2 x 1 processes, 0 GPUs each, recipes/configs/accelerate_cpu.yaml\)", log, re.MULTILINE), log
    assert re.search(r"^the vLLM server healthy after \d+ s$", log, re.MULTILINE), log
    assert {"gym_bridge: rank 0 of 2", "gym_bridge: rank 1 of 2"} <= set(log.splitlines()), log
    assert ("NotImplementedError: Weight synchronization runs on vLLM's NCCL weight-transfer engine, which needs a CUDA "
            "device, got 'cpu:0'. Generation through the server is unaffected.") in log, log


@pytest.mark.slurm
def test_trl_grpo_trains_on_two_nodes_with_generation_from_the_frozen_vllm_server(slurm, tmp_path):
    """WEIGHT_SYNC=0: the same job trains for real on a CPU cluster: one GRPO step on n1 + n2 as one gloo
    process group (world size checked), every rank's rollouts generated by the vLLM CPU server on n3 over
    /v1/completions. No weights reach the server: its rollouts stay those of the initial policy."""
    out = tmp_path / "out"
    extra = (f"--set grpo.max_steps=1 --set grpo.output_dir={out} --set grpo.num_generations=4 "
             "--set grpo.per_device_train_batch_size=4 --set grpo.gradient_accumulation_steps=1 --set grpo.max_completion_length=24")
    env = job_env(ROOT, GPUS_PER_NODE="0", WEIGHT_SYNC="0", CONFIG="recipes/configs/trl_grpo_cpu_demo.yaml",
                  VLLM_ARGS=CPU_VLLM_ARGS, VLLM_CPU_KVCACHE_SPACE="1", EXTRA_ARGS=extra)
    started = time.monotonic()
    rc, log = submit(ROOT, env, "--gpus-per-node=0", "slurm/trl_grpo.sbatch", timeout_s=900)
    print(f"trl_grpo.sbatch WEIGHT_SYNC=0: {time.monotonic() - started:.0f} s")
    assert rc == 0, log
    assert {"gym_bridge: rank 0 of 2", "gym_bridge: rank 1 of 2"} <= set(log.splitlines()), log
    assert re.search(r"^gym_bridge: generation from http://10\.250\.0\.13:8000/v1; no weights are sent there", log, re.MULTILINE), log
    assert log.count('"POST /v1/completions HTTP/1.1" 200') >= 8, log  # 4 prompts x 4 generations over both ranks
    [history] = [json.loads((run / "log_history.json").read_text()) for run in (out / "rollouts").glob("run-*")]
    [step] = [entry for entry in history if "loss" in entry]
    assert step["step"] == 1 and "reward" in step
    for rank in (0, 1):
        records = records_of(next((out / "rollouts").glob(f"run-*/rollouts.rank{rank}.jsonl")))
        assert len(records) == 4 and all(record["tokens"]["completion_ids"] for record in records)


@pytest.mark.slurm
def test_verl_grpo_gets_a_ray_cluster_and_the_data_then_refuses_cpu_nodes(slurm, tmp_path):
    """verl_grpo.sbatch on n1 + n2: the Ray cluster joins (both nodes, counted as nodes: there are no GPUs),
    the data is converted, and the recipe refuses in one line, as verl 0.9.1 has no CPU path."""
    started = time.monotonic()
    rc, log = submit(ROOT, job_env(ROOT, OUT=str(tmp_path)), "--gpus-per-node=0", "slurm/verl_grpo.sbatch")
    print(f"verl_grpo.sbatch: {time.monotonic() - started:.0f} s")
    assert rc == 2, log
    assert re.search(r"^ray: 2 nodes joined", log, re.MULTILINE), log
    assert f"refused: verl 0.9.1 trains on GPUs only and GPUS_PER_NODE=0 (data ready in {tmp_path}/train.parquet)" in log
    assert (tmp_path / "train.parquet").is_file()
