#!/usr/bin/env bash
# MATH with Llama-3.1-8B-Instruct on Megatron: the REC paper's MATH setting ("Group-Relative REINFORCE
# Is Secretly an Off-Policy Algorithm", Tables 1 and 2, MATH column; its Figure 11): K = 16 responses
# per prompt, 64 prompts per step, one optimizer step per batch, AdamW (0.9, 0.999), lr 5e-7 with 40
# constant warm-up steps, weight decay 0.1 (constant increment style), grad clip 1.0, training sampling
# at temperature 1.0 / top-p 1.0, evaluation at temperature 0.6 / top-p 1.0. Not from the paper's
# tables (ours): responses up to 2048 tokens, prompts up to 1024, 8 GPUs with TP = 4 / PP = 1, 500 steps.
# The AsymRE paper's MATH setting (K = 8, 16 prompts, lr 6e-8) is math_llama3.1-8b_megatron_asymre.sh.
#
#   recipes/prepare_data.sh math
#   recipes/math_llama3.1-8b_megatron.sh PRESET [HYDRA_OVERRIDES...]
#
# SYNC_INTERVAL / SYNC_OFFSET set the schedule (default 1/0: on-policy). DRY_RUN=1 only composes and
# validates the command line.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
PRESET=${1:?usage: recipes/math_llama3.1-8b_megatron.sh PRESET [HYDRA_OVERRIDES...]}
shift
require_preset "$PRESET"

MODEL=${MODEL:-meta-llama/Llama-3.1-8B-Instruct}

run_main_ppo --config-name offpolicy_megatron_trainer "algorithm=$PRESET" "${SCHEDULE[@]}" \
  "data.train_files=$DATA_DIR/math/train.parquet" "data.val_files=$DATA_DIR/math/test.parquet" \
  data.train_batch_size=64 data.max_prompt_length=1024 data.max_response_length=2048 \
  "actor_rollout_ref.model.path=$MODEL" \
  actor_rollout_ref.actor.optim.lr=5e-7 actor_rollout_ref.actor.optim.lr_warmup_steps=40 \
  actor_rollout_ref.actor.optim.lr_decay_style=constant actor_rollout_ref.actor.optim.weight_decay=0.1 \
  actor_rollout_ref.actor.optim.weight_decay_incr_style=constant actor_rollout_ref.actor.optim.clip_grad=1.0 \
  actor_rollout_ref.actor.use_dynamic_bsz=true actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192 \
  actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4 \
  actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1 \
  actor_rollout_ref.ref.megatron.tensor_model_parallel_size=4 \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=16 \
  actor_rollout_ref.rollout.temperature=1.0 actor_rollout_ref.rollout.top_p=1.0 \
  actor_rollout_ref.rollout.val_kwargs.do_sample=true actor_rollout_ref.rollout.val_kwargs.temperature=0.6 \
  actor_rollout_ref.rollout.val_kwargs.top_p=1.0 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=2 actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
  actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true \
  "trainer.n_gpus_per_node=$NGPUS" trainer.nnodes=1 trainer.total_training_steps=500 \
  trainer.test_freq=50 trainer.save_freq=100 trainer.project_name=verl-offpolicy-math \
  "trainer.experiment_name=llama3.1-8b-${PRESET}-s${SYNC_INTERVAL}-d${SYNC_OFFSET}" \
  "$@"
