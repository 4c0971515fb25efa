#!/usr/bin/env bash
# MATH with Llama-3.1-8B-Instruct on Megatron in the AsymRE paper's setting (arXiv 2506.20520, as
# Trinity-RFT's rec_family scripts run it): K = 8, 16 prompts per step, lr 6e-8 (AdamW), responses up
# to 2048 tokens, training temperature 1.0, 2000 steps, 8 GPUs with TP = 4 / PP = 1. This is NOT the REC
# paper's MATH setting (Table 1: K = 16, 64 prompts, lr 5e-7): that is math_llama3.1-8b_megatron.sh.
#
#   recipes/prepare_data.sh math
#   recipes/math_llama3.1-8b_megatron.sh PRESET [HYDRA_OVERRIDES...]
#
# Trinity-RFT's MATH runs synchronise the rollout every 250 steps (SYNC_INTERVAL=250; default 1).
# DRY_RUN=1 only composes and validates the command line.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
PRESET=${1:?usage: recipes/math_llama3.1-8b_megatron_asymre.sh PRESET [HYDRA_OVERRIDES...]}
shift
require_preset "$PRESET"

MODEL=${MODEL:-meta-llama/Llama-3.1-8B-Instruct}

run_main_ppo --config-name offpolicy_megatron_trainer "algorithm=$PRESET" "${SCHEDULE[@]}" \
  "data.train_files=$DATA_DIR/math/train.parquet" "data.val_files=$DATA_DIR/math/test.parquet" \
  data.train_batch_size=16 data.max_prompt_length=1024 data.max_response_length=2048 \
  "actor_rollout_ref.model.path=$MODEL" \
  actor_rollout_ref.actor.optim.lr=6e-8 \
  actor_rollout_ref.actor.use_dynamic_bsz=true actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192 \
  actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4 \
  actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1 \
  actor_rollout_ref.ref.megatron.tensor_model_parallel_size=4 \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=8 actor_rollout_ref.rollout.temperature=1.0 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=2 actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
  actor_rollout_ref.rollout.val_kwargs.temperature=0.1 actor_rollout_ref.rollout.val_kwargs.top_p=0.95 \
  actor_rollout_ref.rollout.val_kwargs.do_sample=true \
  actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true \
  "trainer.n_gpus_per_node=$NGPUS" trainer.nnodes=1 trainer.total_training_steps=2000 \
  trainer.test_freq=100 trainer.save_freq=250 trainer.project_name=verl-offpolicy-math-asymre \
  "trainer.experiment_name=llama3.1-8b-${PRESET}-s${SYNC_INTERVAL}-d${SYNC_OFFSET}" \
  "$@"
