#!/usr/bin/env bash
# GRPO with NeMo RL on gym_bridge environments, either way in:
#   WAY=serve  bash recipes/nemo_rl/grpo.sh   # NeMo Gym agent servers (gym-bridge serve), NeMo RL's preferred path
#   WAY=native bash recipes/nemo_rl/grpo.sh   # gym_bridge.nemo_rl.GymBridgeEnvironment in NeMo RL's own rollout
# Run from the NeMo RL checkout's venv (uv run ... or its container) with gym-bridge installed in it:
#   NEMO_RL_DIR=/path/to/RL BASE=examples/configs/grpo_math_1B.yaml bash recipes/nemo_rl/grpo.sh cluster.gpus_per_node=8
# Extra arguments are NeMo RL (Hydra) overrides. Multi-node: NeMo RL's own Ray/Slurm launch
# (ray.sub in its repository) running this script as the command.
set -euo pipefail

WAY=${WAY:-serve}
NEMO_RL_DIR=${NEMO_RL_DIR:?set NEMO_RL_DIR to the NeMo RL checkout}
BASE=${BASE:-examples/configs/grpo_math_1B.yaml}                    # relative to NEMO_RL_DIR, or absolute
DATA=${DATA:-"environments/weather/data/example.jsonl environments/multi_step/data/example.jsonl environments/math/data/example.jsonl"}
OUT=${OUT:-out/nemo_rl}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
GYM_BRIDGE_DIR=$(cd "$HERE/../.." && pwd)

mkdir -p "$OUT"
# The rows, checked, with agent_ref.name set to each row's environment (the agent server's key).
# shellcheck disable=SC2086
python - "$OUT" $DATA <<'PY'
import json, sys
from gym_bridge import load_tasks
from gym_bridge.core.registry import resolve_tasks
out, paths = sys.argv[1], sys.argv[2:]
tasks = [task for path in paths for task in load_tasks(path)]
classes = resolve_tasks(tasks)
rows = [{**task.row, "agent_ref": {"type": "responses_api_agents", "name": classes[task.env_name].name}} for task in tasks]
with open(f"{out}/train.jsonl", "w") as train, open(f"{out}/validation.jsonl", "w") as validation:
    for i, row in enumerate(rows):
        (validation if i % 10 == 0 else train).write(json.dumps(row) + "\n")
print(f"{len(rows)} rows -> {out}/train.jsonl, {out}/validation.jsonl")
PY

[[ "$BASE" = /* ]] || BASE="$NEMO_RL_DIR/$BASE"
CONFIG="$(cd "$OUT" && pwd)/grpo_${WAY}.yaml"
printf 'defaults:\n  - %s\n  - %s\n' "$BASE" "$HERE/grpo_${WAY}.yaml" > "$CONFIG"
DATA_ARGS=("data.train.data_path=$(cd "$OUT" && pwd)/train.jsonl" "data.validation.data_path=$(cd "$OUT" && pwd)/validation.jsonl")

cd "$NEMO_RL_DIR"
if [[ "$WAY" == serve ]]; then
    export NEMO_GYM_EXTRA_ROOTS="$HERE${NEMO_GYM_EXTRA_ROOTS:+:$NEMO_GYM_EXTRA_ROOTS}"
    exec python examples/nemo_gym/run_grpo_nemo_gym.py --config "$CONFIG" "${DATA_ARGS[@]}" "$@"
elif [[ "$WAY" == native ]]; then
    exec env NEMO_RL_DIR="$NEMO_RL_DIR" python "$HERE/run_grpo_native.py" --config "$CONFIG" "${DATA_ARGS[@]}" "$@"
else
    echo "WAY must be serve or native, got $WAY" >&2
    exit 2
fi
