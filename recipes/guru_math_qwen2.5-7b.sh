#!/usr/bin/env bash
# Guru-Math with Qwen2.5-7B-Instruct on FSDP (the REC paper's larger-scale RED-Weight/REC runs; their exact
# hyperparameters could not be verified here, so this follows the GSM8K recipe scaled to 7B and
# Trinity-RFT's Guru-Math benchmark: K = 8, 64 prompts per step, lr 1e-6, responses up to 4096 tokens).
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
  actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.ppo_mini_batch_size=64 \
  actor_rollout_ref.actor.use_dynamic_bsz=true actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24576 \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=8 actor_rollout_ref.rollout.temperature=1.0 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=2 actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
  actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true \
  "trainer.n_gpus_per_node=$NGPUS" trainer.nnodes=1 trainer.total_training_steps=400 \
  trainer.test_freq=25 trainer.save_freq=50 trainer.project_name=verl-offpolicy-guru-math \
  "trainer.experiment_name=qwen2.5-7b-${PRESET}-s${SYNC_INTERVAL}-d${SYNC_OFFSET}" \
  "$@"
