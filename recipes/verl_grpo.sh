#!/usr/bin/env bash
# GRPO with verl 0.9.1 on gym_bridge environments: vLLM rollouts, gym_bridge's agent loop
# (multi-turn tool calls, token-exact, failed rollouts masked), verl's FSDP actor.
#
#   bash recipes/verl_grpo.sh                                   # one node, all its GPUs, the bundled example data
#   MODEL=Qwen/Qwen2.5-7B-Instruct DATA="my_tasks.jsonl environments/math/data/example.jsonl" \
#       bash recipes/verl_grpo.sh trainer.total_epochs=3        # extra arguments are Hydra overrides
#   DRY_RUN=1 bash recipes/verl_grpo.sh                         # print the command instead of running it
#
# Multi-node: slurm/verl_grpo.sbatch starts a Ray cluster and runs this script on its head node
# (NNODES, GPUS_PER_NODE). Needs `pip install 'gym-bridge[verl]' vllm` on every node.
# verl 0.9.1 has no CPU path: GPUS_PER_NODE=0 (or no GPU found) converts the data, then refuses.
set -euo pipefail

MODEL=${MODEL:-Qwen/Qwen2.5-1.5B-Instruct}
DATA=${DATA:-"environments/weather/data/example.jsonl environments/multi_step/data/example.jsonl environments/math/data/example.jsonl"}
OUT=${OUT:-out/verl_grpo}
NNODES=${NNODES:-1}
GPUS_PER_NODE=${GPUS_PER_NODE:-$( (nvidia-smi -L 2>/dev/null || true) | wc -l)}
GROUP_SIZE=${GROUP_SIZE:-8}                  # rollouts per task (GRPO group)
BATCH_TASKS=${BATCH_TASKS:-32}               # tasks per step (data.train_batch_size)
MAX_PROMPT=${MAX_PROMPT:-1024}               # rollout.prompt_length: longer prompts are masked context overflows
MAX_RESPONSE=${MAX_RESPONSE:-2048}           # rollout.response_length: all turns, model and tool tokens
TP=${TP:-1}                                  # vLLM tensor parallelism

mkdir -p "$OUT"
# Rows are checked here (file:line: field) and again when verl loads them (GymBridgeDataset).
# shellcheck disable=SC2086
gym-bridge data to-verl $DATA --output "$OUT/train.parquet"
AGENT_LOOP=$(python -c "from gym_bridge.verl import AGENT_LOOP_CONFIG; print(AGENT_LOOP_CONFIG)")

ARGS=(
    algorithm.adv_estimator=gym_bridge_grpo    # GRPO with failed (masked) rollouts out of the group statistics
    algorithm.use_kl_in_reward=false
    data.train_files="$OUT/train.parquet"
    data.val_files="$OUT/train.parquet"
    data.train_batch_size="$BATCH_TASKS"
    data.max_prompt_length="$MAX_PROMPT"
    data.max_response_length="$MAX_RESPONSE"
    data.filter_overlong_prompts=false
    data.custom_cls.path=pkg://gym_bridge.verl
    data.custom_cls.name=GymBridgeDataset
    actor_rollout_ref.model.path="$MODEL"
    actor_rollout_ref.model.use_remove_padding=true
    actor_rollout_ref.model.enable_gradient_checkpointing=true
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.actor.ppo_mini_batch_size="$BATCH_TASKS"
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
    actor_rollout_ref.actor.use_kl_loss=false
    actor_rollout_ref.actor.entropy_coeff=0
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.mode=async
    actor_rollout_ref.rollout.n="$GROUP_SIZE"
    actor_rollout_ref.rollout.prompt_length="$MAX_PROMPT"
    actor_rollout_ref.rollout.response_length="$MAX_RESPONSE"
    actor_rollout_ref.rollout.tensor_model_parallel_size="$TP"
    actor_rollout_ref.rollout.gpu_memory_utilization=0.5
    actor_rollout_ref.rollout.calculate_log_probs=true
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8
    actor_rollout_ref.rollout.agent.agent_loop_config_path="$AGENT_LOOP"
    actor_rollout_ref.rollout.agent.default_agent_loop=gym_bridge
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8
    trainer.n_gpus_per_node="$GPUS_PER_NODE"
    trainer.nnodes="$NNODES"
    trainer.logger='["console"]'
    trainer.project_name=gym_bridge
    trainer.experiment_name=verl_grpo
    trainer.val_before_train=false
    trainer.test_freq=-1
    trainer.save_freq=-1
    trainer.total_epochs=1
    trainer.default_local_dir="$OUT/checkpoints"
    hydra.run.dir="$OUT/hydra"                 # not ./outputs/DATE in the checkout
)

if (( GPUS_PER_NODE < 1 )) && [[ -z "${DRY_RUN:-}" ]]; then
    # verl's resource pools place every actor, rollout and reference worker on GPUs: on CPU nodes main_ppo
    # waits for its TransferQueue actors, then stops with "Total available GPUs 0 is less than total desired GPUs".
    echo "refused: verl 0.9.1 trains on GPUs only and GPUS_PER_NODE=$GPUS_PER_NODE (data ready in $OUT/train.parquet)" >&2
    exit 2
fi
if [[ -n "${DRY_RUN:-}" ]]; then
    printf '%s\n' python -m verl.trainer.main_ppo "${ARGS[@]}" "$@"
    exit 0
fi
export TOKENIZERS_PARALLELISM=false
exec python -m verl.trainer.main_ppo "${ARGS[@]}" "$@"
