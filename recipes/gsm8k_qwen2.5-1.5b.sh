#!/usr/bin/env bash
# GSM8K with Qwen2.5-1.5B-Instruct on FSDP: the REC paper's GSM8K setting ("Group-Relative REINFORCE Is
# Secretly an Off-Policy Algorithm", Tables 1 and 2, GSM8K column; Trinity-RFT examples/rec_gsm8k):
# K = 8 responses per prompt, 96 prompts per step, one optimizer step per batch, AdamW (0.9, 0.999),
# lr 1e-6 constant, no warm-up, weight decay 0.01, grad clip 1.0, training and evaluation sampling at
# temperature 1.0 / top-p 1.0, 160 steps, 8 GPUs. Not from the paper's tables (ours): responses up to
# 1024 tokens, prompts up to 256, evaluation every 20 steps.
#
#   recipes/prepare_data.sh gsm8k
#   recipes/gsm8k_qwen2.5-1.5b.sh PRESET [HYDRA_OVERRIDES...]
#
# The paper's off-policy settings: SYNC_INTERVAL=20 (stale rollouts), SYNC_OFFSET=10 (delayed
# feedback); the default 1/0 is on-policy. DRY_RUN=1 only composes and validates the command line.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
PRESET=${1:?usage: recipes/gsm8k_qwen2.5-1.5b.sh PRESET [HYDRA_OVERRIDES...]}
shift
require_preset "$PRESET"

MODEL=${MODEL:-Qwen/Qwen2.5-1.5B-Instruct}

run_main_ppo --config-name offpolicy_trainer "algorithm=$PRESET" "${SCHEDULE[@]}" \
  "data.train_files=$DATA_DIR/gsm8k/train.parquet" "data.val_files=$DATA_DIR/gsm8k/test.parquet" \
  data.train_batch_size=96 data.max_prompt_length=256 data.max_response_length=1024 \
  "actor_rollout_ref.model.path=$MODEL" actor_rollout_ref.model.use_remove_padding=true \
  actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.optim.weight_decay=0.01 \
  actor_rollout_ref.actor.optim.lr_warmup_steps=0 actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.0 \
  actor_rollout_ref.actor.optim.lr_scheduler_type=constant actor_rollout_ref.actor.grad_clip=1.0 \
  actor_rollout_ref.actor.use_dynamic_bsz=true actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384 \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.rollout.temperature=1.0 actor_rollout_ref.rollout.top_p=1.0 \
  actor_rollout_ref.rollout.val_kwargs.do_sample=true actor_rollout_ref.rollout.val_kwargs.temperature=1.0 \
  actor_rollout_ref.rollout.val_kwargs.top_p=1.0 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
  actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true \
  "trainer.n_gpus_per_node=$NGPUS" trainer.nnodes=1 trainer.total_training_steps=160 \
  trainer.test_freq=20 trainer.save_freq=20 trainer.project_name=verl-offpolicy-gsm8k \
  "trainer.experiment_name=qwen2.5-1.5b-${PRESET}-s${SYNC_INTERVAL}-d${SYNC_OFFSET}" \
  "$@"
