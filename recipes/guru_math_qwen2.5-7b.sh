#!/usr/bin/env bash
# Guru-Math with Qwen2.5-7B-Instruct on FSDP: the REC paper's Guru setting ("Group-Relative REINFORCE Is
# Secretly an Off-Policy Algorithm", Tables 1 and 2, "Guru Qwen2.5 7B" column; its Figure 5): K = 16
# responses per prompt, 64 prompts per step, one optimizer step per batch, AdamW (0.9, 0.999), lr 1e-6
# with 80 constant warm-up steps, weight decay 0.1, grad clip 1.0, training sampling at temperature 1.0 /
# top-p 1.0 (the paper gives no evaluation setting for Guru). Not from the paper's tables (ours):
# responses up to 4096 tokens, prompts up to 1024, 400 steps, 8 GPUs.
# Reward: math-verify equivalence of the final answer (verl_offpolicy.rewards.math_verify_reward).
#
#   recipes/prepare_data.sh guru_math
#   recipes/guru_math_qwen2.5-7b.sh PRESET [HYDRA_OVERRIDES...]
#
# DRY_RUN=1 only composes and validates the command line.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
PRESET=${1:?usage: recipes/guru_math_qwen2.5-7b.sh PRESET [HYDRA_OVERRIDES...]}
shift
require_preset "$PRESET"

MODEL=${MODEL:-Qwen/Qwen2.5-7B-Instruct}
REWARD_FILE=$(python3 -c "import verl_offpolicy.rewards.math_verify_reward as m; print(m.__file__)")

run_main_ppo --config-name offpolicy_trainer "algorithm=$PRESET" "${SCHEDULE[@]}" \
  "data.train_files=$DATA_DIR/guru_math/train.parquet" "data.val_files=$DATA_DIR/guru_math/test.parquet" \
  data.train_batch_size=64 data.max_prompt_length=1024 data.max_response_length=4096 \
  "reward.custom_reward_function.path=$REWARD_FILE" reward.custom_reward_function.name=compute_score \
  "actor_rollout_ref.model.path=$MODEL" actor_rollout_ref.model.use_remove_padding=true \
  actor_rollout_ref.model.enable_gradient_checkpointing=true \
  actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.optim.weight_decay=0.1 \
  actor_rollout_ref.actor.optim.lr_warmup_steps=80 actor_rollout_ref.actor.optim.lr_scheduler_type=constant \
  actor_rollout_ref.actor.grad_clip=1.0 \
  actor_rollout_ref.actor.use_dynamic_bsz=true actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24576 \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=16 \
  actor_rollout_ref.rollout.temperature=1.0 actor_rollout_ref.rollout.top_p=1.0 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=2 actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
  actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true \
  "trainer.n_gpus_per_node=$NGPUS" trainer.nnodes=1 trainer.total_training_steps=400 \
  trainer.test_freq=25 trainer.save_freq=50 trainer.project_name=verl-offpolicy-guru-math \
  "trainer.experiment_name=qwen2.5-7b-${PRESET}-s${SYNC_INTERVAL}-d${SYNC_OFFSET}" \
  "$@"
