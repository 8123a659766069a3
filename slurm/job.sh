# What every sbatch script here does, sourced from the checkout (`source slurm/job.sh`) after `cd` into it:
# activate the checkout's virtualenv, find a node's own address, and bring a Ray cluster up across the
# allocation and down again. Every wait is bounded and ends with the error that stopped it; a setting
# that cannot work is refused with a one-line reason (`refuse`) and a non-zero exit, never a hang.
# Functions only: sourcing runs nothing (tests/test_slurm_scripts.py calls them one by one).

# refuse MESSAGE...: one line on stderr, exit 2 (a setting to fix, not a crash).
refuse() { echo "refused: $*" >&2; exit 2; }

# activate_venv: source GYM_BRIDGE_VENV (default: the checkout's .venv) when it exists.
activate_venv() {
    local venv=${GYM_BRIDGE_VENV:-$PWD/.venv}
    if [[ -f $venv/bin/activate ]]; then
        # shellcheck disable=SC1091
        source "$venv/bin/activate"
    elif [[ -n ${GYM_BRIDGE_VENV:-} ]]; then
        refuse "GYM_BRIDGE_VENV=$GYM_BRIDGE_VENV has no bin/activate"
    fi
}

# require_command NAME HINT: refuse when NAME is not on PATH.
require_command() { command -v "$1" >/dev/null || refuse "$1 is not installed here: $2"; }

# node_address: this node's IPv4 address as the other nodes reach it. `hostname --ip-address` resolves the
# hostname through /etc/hosts, which on Debian maps it to 127.0.1.1; a loopback answer is skipped for the
# first address of `hostname --all-ip-addresses` (the interfaces' own addresses).
node_address() {
    local address
    address=$(getent ahostsv4 "$(hostname)" 2>/dev/null | awk '$1 !~ /^127\./ {print $1; exit}')
    [[ -n $address ]] || address=$(hostname --all-ip-addresses 2>/dev/null | awk '{print $1}')
    [[ -n $address ]] || { echo "node_address: $(hostname) has no address outside loopback" >&2; return 1; }
    echo "$address"
}

# address_of NODE: node_address, run on NODE (a job step).
address_of() {
    srun --overlap --nodes=1 --ntasks=1 --nodelist="$1" bash -c 'source slurm/job.sh && node_address'
}

# gpu_request GPUS: the srun option asking for GPUS per node ("" for 0: a CPU cluster has no GPU gres,
# and any GPU request there is rejected).
gpu_request() { (( $1 > 0 )) && echo "--gpus-per-node=$1" || true; }

# rank_status_dir: a fresh folder under the checkout's logs/ (a filesystem every node shares, as the job's output is
# there) where the tasks of a job step record how they ended (run_rank), for first_failure to read.
rank_status_dir() { mktemp -d "$PWD/logs/.ranks-${SLURM_JOB_ID:-local}.XXXXXX"; }

# run_rank DIR COMMAND...: (in a task of a job step) run COMMAND and record "<time ns> <rank> <exit code>" in
# DIR/rank-$SLURM_PROCID, then end with its exit code. A task that srun kills (--kill-on-bad-exit) records nothing.
run_rank() {
    local dir=$1 rc=0; shift
    "$@" || rc=$?
    echo "$(date +%s%N) ${SLURM_PROCID:-0} $rc" >"$dir/rank-${SLURM_PROCID:-0}"
    return "$rc"
}

# first_failure DIR STEP_RC: the exit code the job ends with, and DIR removed. srun returns the highest status of
# its tasks, so a rank failing with 1 while --kill-on-bad-exit ends the others with SIGTERM gives 143, naming no
# one: the code of the rank that failed first (by the time it recorded) is said on stderr and echoed; without a
# failing rank on record (srun itself failed, a node died), STEP_RC.
first_failure() {
    local dir=$1 step_rc=$2 first time rank rc
    first=$(cat "$dir"/rank-* 2>/dev/null | awk '$3 != 0' | sort -n | head -n 1)
    rm -rf "$dir"
    if [[ -z $first ]]; then echo "$step_rc"; return; fi
    read -r time rank rc <<<"$first"
    echo "rank $rank failed first, with exit code $rc (the job step ended with $step_rc)" >&2
    echo "$rc"
}

# wait_healthy URL PID TIMEOUT_S WHAT: wait until URL answers 2xx; refuse when the step PID exits first or
# TIMEOUT_S passes, with the last connection error.
wait_healthy() {
    local url=$1 pid=$2 timeout_s=$3 what=$4 waited=0 error
    until error=$(curl -sS -f -o /dev/null --max-time 5 "$url" 2>&1); do
        kill -0 "$pid" 2>/dev/null || refuse "$what exited before $url answered (its output is above); last error: $error"
        (( waited < timeout_s )) || refuse "$what did not answer at $url within ${timeout_s} s; last error: $error"
        sleep 5; waited=$(( waited + 5 ))
    done
    echo "$what healthy after ${waited} s"
}

# check_accelerate_config FILE GPUS_PER_NODE WORLD_SIZE: refuse an accelerate config that cannot run WORLD_SIZE
# processes as one job: one that is not distributed (each process would train alone, all writing one
# output_dir), a DeepSpeed one without DeepSpeed installed, a GPU one on CPU nodes.
check_accelerate_config() {
    local file=$1 gpus=$2 world=$3
    [[ -f $file ]] || refuse "ACCELERATE_CONFIG=$file does not exist"
    python - "$file" "$gpus" "$world" <<'PY' || exit 2
import importlib.util, sys
import yaml

path, gpus, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
config = yaml.safe_load(open(path)) or {}
kind = str(config.get("distributed_type", "NO"))
def refuse(reason: str) -> None:
    sys.exit(f"refused: ACCELERATE_CONFIG={path}: {reason}")
if gpus == 0:
    if kind not in ("NO", "MULTI_CPU") or not config.get("use_cpu"):
        refuse(f"distributed_type {kind} with use_cpu {config.get('use_cpu')} on CPU nodes (GPUS_PER_NODE=0); "
               "use recipes/configs/accelerate_cpu.yaml (one process per node, the process group from Slurm)")
elif world > 1 and kind == "NO":
    refuse(f"distributed_type NO runs each of the {world} processes as its own training (world size 1, all writing "
           "one output_dir); use accelerate_zero2.yaml, accelerate_zero3.yaml or a MULTI_GPU config")
if kind == "DEEPSPEED" and importlib.util.find_spec("deepspeed") is None:
    refuse("needs DeepSpeed, which `make install` does not install: `make install-deepspeed` "
           "(or pip install deepspeed), or a config without it")
PY
}

# ray_auth: one token-authentication setting for every Ray process of the job. Ray 2.60's `ray start --head`
# turns token auth on when ~/.ray/auth_token exists, while `ray start --address` and `ray.init()` do not,
# so a shared home with that file (any earlier local ray.init() writes it) splits the cluster. Unless
# RAY_AUTH_MODE is set: token auth with a fresh token for this job, passed to the steps in the environment.
ray_auth() {
    if [[ -z ${RAY_AUTH_MODE:-} ]]; then
        export RAY_AUTH_MODE=token
        if [[ -z ${RAY_AUTH_TOKEN:-} && -z ${RAY_AUTH_TOKEN_PATH:-} ]]; then
            RAY_AUTH_TOKEN=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')
            export RAY_AUTH_TOKEN
        fi
    fi
}

RAY_STEP_PIDS=()
RAY_NODES=()

# ray_step NODE ROLE RAY-START-ARGUMENTS: `ray start ... --block` as a job step named ray-ROLE on NODE, in
# the background (ray_down ends it).
ray_step() {
    local node=$1 role=$2; shift 2
    srun --quiet --overlap --nodes=1 --ntasks=1 --nodelist="$node" --job-name="ray-$role" \
        bash -c "source slurm/job.sh && exec ray start $* --disable-usage-stats --block" &
    RAY_STEP_PIDS+=($!)
}

# ray_up PORT RESOURCES_JSON GPUS NODE...: a Ray head on the first NODE and a worker on every other one, each
# a job step blocking for the job's lifetime and offering its node's CPUs (CPUS_PER_NODE to override) and
# GPUS GPUs. Exports RAY_ADDRESS. Wait for them with ray_wait_nodes; stop them with ray_down.
ray_up() {
    local port=$1 resources=$2 gpus=$3; shift 3
    RAY_NODES=("$@")
    local head_ip cpus node
    head_ip=$(address_of "${RAY_NODES[0]}") || refuse "no address for the Ray head node ${RAY_NODES[0]}"
    export RAY_ADDRESS="$head_ip:$port"
    ray_auth
    # shellcheck disable=SC2016  # expanded on each node: its own CPU count
    cpus=${CPUS_PER_NODE:-'${SLURM_CPUS_ON_NODE:-$(nproc)}'}
    ray_step "${RAY_NODES[0]}" head --head --node-ip-address="'$head_ip'" --port="'$port'" --num-cpus="$cpus" \
        --num-gpus="'$gpus'" --resources="'$resources'" --include-dashboard=false
    for node in "${RAY_NODES[@]:1}"; do
        # shellcheck disable=SC2016
        ray_step "$node" worker --address="'$RAY_ADDRESS'" --node-ip-address='"$(node_address)"' \
            --num-cpus="$cpus" --num-gpus="'$gpus'" --resources="'$resources'"
    done
}

# ray_wait_nodes NODES GPUS TIMEOUT_S: wait until NODES nodes (and GPUS GPUs in all) are alive in the cluster
# at RAY_ADDRESS. Returns non-zero with the reason on stderr (each failed connection's error as it happens,
# or the head's step having exited) when that does not happen within TIMEOUT_S. `timeout` bounds it: one
# ray.init() against an address where nothing answers blocks for minutes.
ray_wait_nodes() {
    local rc=0
    timeout --kill-after=5 "$3" python - "$1" "$2" "$3" "${RAY_STEP_PIDS[0]:-0}" <<'EOF' || rc=$?
import os, sys, time

want_nodes, want_gpus, timeout_s, head_pid = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
address = os.environ["RAY_ADDRESS"]
deadline = time.monotonic() + timeout_s


def head_alive() -> bool:
    try:
        os.kill(head_pid, 0)
        return True
    except OSError:
        return head_pid == 0


import ray

error = None
while True:
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        break
    except Exception as exc:  # noqa: BLE001 - kept and printed when the wait ends
        error = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
        print(f"ray: not connected yet: {error}", file=sys.stderr, flush=True)
    if not head_alive():
        sys.exit(f"ray: the head's job step exited before it answered at {address}; last error: {error}")
    if time.monotonic() > deadline:
        sys.exit(f"ray: the head at {address} did not answer within {timeout_s:g} s; last error: {error}")
    time.sleep(2)
while True:
    nodes = sum(node["Alive"] for node in ray.nodes())
    gpus = ray.cluster_resources().get("GPU", 0)
    if nodes >= want_nodes and gpus >= want_gpus:
        break
    if time.monotonic() > deadline:
        sys.exit(f"ray: {nodes} of {want_nodes} nodes and {gpus:g} of {want_gpus} GPUs joined within {timeout_s:g} s")
    time.sleep(2)
print(f"ray: {nodes} nodes joined; resources {ray.cluster_resources()}", flush=True)
EOF
    (( rc != 124 && rc != 137 )) || echo "ray: the cluster at $RAY_ADDRESS was not ready within $3 s (see the errors above)" >&2
    return "$rc"
}

# ray_down: end the blocking `ray start` steps first (a SIGTERM to their srun cancels them), then `ray stop`
# on every node for whatever is left. The other order fills the job's output: `ray start --block` reports
# every daemon `ray stop` ends (SIGKILLed with --force, and the GCS even without) with the tail of its log,
# ~470 lines; this way Slurm's few lines saying the steps were cancelled remain. Bounded: a step's
# processes get SIGKILL after Slurm's KillWait, `ray stop` after its grace period.
ray_down() {
    local node pid
    for pid in "${RAY_STEP_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${RAY_STEP_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    for node in "${RAY_NODES[@]}"; do
        srun --quiet --overlap --nodes=1 --ntasks=1 --nodelist="$node" ray stop --grace-period 10 >/dev/null 2>&1 || true
    done
    RAY_STEP_PIDS=()
}
