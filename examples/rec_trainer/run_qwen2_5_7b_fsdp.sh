#!/usr/bin/env bash
# REC family | Guru-Math | Qwen2.5-7B-Instruct | vLLM rollout | FSDP training | GPU
# The REC paper's Guru setting ("Group-Relative REINFORCE Is Secretly an Off-Policy Algorithm", Tables 1
# and 2, "Guru Qwen2.5 7B" column; its Figure 5): K = 16 responses per prompt, 64 prompts per step, one
# optimizer step per batch, AdamW (0.9, 0.999), lr 1e-6 with 80 constant warm-up steps, weight decay 0.1,
# grad clip 1.0, training sampling at temperature 1.0 / top-p 1.0 (the paper gives no evaluation setting
# for Guru). Not from the paper's tables (ours): responses up to 4096 tokens, prompts up to 1024, 400
# steps. Reward: math-verify equivalence of the final answer (verl_offpolicy.rewards.math_verify_reward).
#
#   examples/data_preprocess/prepare_data.sh guru_math
#   PRESET=rec_oneside_nois bash examples/rec_trainer/run_qwen2_5_7b_fsdp.sh [HYDRA_OVERRIDES...]
#
# DRY_RUN=1 only composes and validates the command line (no GPU).
set -euo pipefail
source "$(dirname "$0")/../common.bash"

# ---- user-adjustable ----
PRESET=${PRESET:-rec_oneside_nois}          # any preset of `verl-offpolicy list`
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-7B-Instruct}
DATA_DIR=${DATA_DIR:-$HOME/data}
INFER_BACKEND=${INFER_BACKEND:-vllm}        # vllm | sglang
NNODES=${NNODES:-1}
NDEVICES_PER_NODE=${NDEVICES_PER_NODE:-8}
ROLLOUT_TP=${ROLLOUT_TP:-2}
SYNC_INTERVAL=${SYNC_INTERVAL:-1}           # s: rollout weights refreshed every s steps
SYNC_OFFSET=${SYNC_OFFSET:-0}               # d: feedback delayed by d steps
TOTAL_STEPS=${TOTAL_STEPS:-400}
PROJECT_NAME=${PROJECT_NAME:-verl_offpolicy_guru_math}
EXPERIMENT_NAME=${EXPERIMENT_NAME:-qwen2_5_7b_${PRESET}_s${SYNC_INTERVAL}_d${SYNC_OFFSET}}
# ---- end user-adjustable ----

require_preset "$PRESET"
require_choice INFER_BACKEND "$INFER_BACKEND" vllm sglang
REWARD_FILE=$(python3 -c "import verl_offpolicy.rewards.math_verify_reward as m; print(m.__file__)")

run_main_ppo --config-name offpolicy_trainer "algorithm=$PRESET" \
  "algorithm.offpolicy.sync_interval=$SYNC_INTERVAL" "algorithm.offpolicy.sync_offset=$SYNC_OFFSET" \
  "data.train_files=$DATA_DIR/guru_math/train.parquet" "data.val_files=$DATA_DIR/guru_math/test.parquet" \
  data.train_batch_size=64 data.max_prompt_length=1024 data.max_response_length=4096 \
  "reward.custom_reward_function.path=$REWARD_FILE" reward.custom_reward_function.name=compute_score \
  "actor_rollout_ref.model.path=$MODEL_PATH" actor_rollout_ref.model.use_remove_padding=true \
  actor_rollout_ref.model.enable_gradient_checkpointing=true \
  actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.optim.weight_decay=0.1 \
  actor_rollout_ref.actor.optim.lr_warmup_steps=80 actor_rollout_ref.actor.optim.lr_scheduler_type=constant \
  actor_rollout_ref.actor.grad_clip=1.0 \
  actor_rollout_ref.actor.use_dynamic_bsz=true actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24576 \
  "actor_rollout_ref.rollout.name=$INFER_BACKEND" actor_rollout_ref.rollout.n=16 \
  actor_rollout_ref.rollout.temperature=1.0 actor_rollout_ref.rollout.top_p=1.0 \
  "actor_rollout_ref.rollout.tensor_model_parallel_size=$ROLLOUT_TP" actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
  actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true \
  "trainer.n_gpus_per_node=$NDEVICES_PER_NODE" "trainer.nnodes=$NNODES" "trainer.total_training_steps=$TOTAL_STEPS" \
  trainer.test_freq=25 trainer.save_freq=50 "trainer.project_name=$PROJECT_NAME" \
  "trainer.experiment_name=$EXPERIMENT_NAME" \
  "$@"
