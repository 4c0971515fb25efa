#!/usr/bin/env bash
# REC family | GSM8K | Qwen2.5-1.5B-Instruct | vLLM rollout | FSDP training | GPU
# The REC paper's GSM8K setting ("Group-Relative REINFORCE Is Secretly an Off-Policy Algorithm", Tables 1
# and 2, GSM8K column; Trinity-RFT examples/rec_gsm8k): K = 8 responses per prompt, 96 prompts per step,
# one optimizer step per batch, AdamW (0.9, 0.999), lr 1e-6 constant, no warm-up, weight decay 0.01, grad
# clip 1.0, training and evaluation sampling at temperature 1.0 / top-p 1.0. Not from the paper's tables
# (ours): responses up to 1024 tokens, prompts up to 256, 160 steps, evaluation every 20 steps.
# The RED, PMD and AGRO examples run this setting with their own presets.
#
#   examples/data_preprocess/prepare_data.sh gsm8k
#   PRESET=rec_ring_nois SYNC_INTERVAL=20 bash examples/rec_trainer/run_qwen2_5_1_5b_fsdp.sh [HYDRA_OVERRIDES...]
#
# The paper's off-policy settings: SYNC_INTERVAL=20 (stale rollouts), SYNC_OFFSET=10 (delayed feedback);
# the default 1/0 is on-policy. DRY_RUN=1 only composes and validates the command line (no GPU).
set -euo pipefail
source "$(dirname "$0")/../common.bash"

# ---- user-adjustable ----
PRESET=${PRESET:-rec_oneside_nois}          # any preset of `verl-offpolicy list`
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-1.5B-Instruct}
DATA_DIR=${DATA_DIR:-$HOME/data}
INFER_BACKEND=${INFER_BACKEND:-vllm}        # vllm | sglang
NNODES=${NNODES:-1}
NDEVICES_PER_NODE=${NDEVICES_PER_NODE:-8}
ROLLOUT_TP=${ROLLOUT_TP:-1}
SYNC_INTERVAL=${SYNC_INTERVAL:-1}           # s: rollout weights refreshed every s steps
SYNC_OFFSET=${SYNC_OFFSET:-0}               # d: feedback delayed by d steps
TOTAL_STEPS=${TOTAL_STEPS:-160}
PROJECT_NAME=${PROJECT_NAME:-verl_offpolicy_gsm8k}
EXPERIMENT_NAME=${EXPERIMENT_NAME:-qwen2_5_1_5b_${PRESET}_s${SYNC_INTERVAL}_d${SYNC_OFFSET}}
# ---- end user-adjustable ----

require_preset "$PRESET"
require_choice INFER_BACKEND "$INFER_BACKEND" vllm sglang

run_main_ppo --config-name offpolicy_trainer "algorithm=$PRESET" \
  "algorithm.offpolicy.sync_interval=$SYNC_INTERVAL" "algorithm.offpolicy.sync_offset=$SYNC_OFFSET" \
  "data.train_files=$DATA_DIR/gsm8k/train.parquet" "data.val_files=$DATA_DIR/gsm8k/test.parquet" \
  data.train_batch_size=96 data.max_prompt_length=256 data.max_response_length=1024 \
  "actor_rollout_ref.model.path=$MODEL_PATH" actor_rollout_ref.model.use_remove_padding=true \
  actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.optim.weight_decay=0.01 \
  actor_rollout_ref.actor.optim.lr_warmup_steps=0 actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.0 \
  actor_rollout_ref.actor.optim.lr_scheduler_type=constant actor_rollout_ref.actor.grad_clip=1.0 \
  actor_rollout_ref.actor.use_dynamic_bsz=true actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384 \
  "actor_rollout_ref.rollout.name=$INFER_BACKEND" actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.rollout.temperature=1.0 actor_rollout_ref.rollout.top_p=1.0 \
  actor_rollout_ref.rollout.val_kwargs.do_sample=true actor_rollout_ref.rollout.val_kwargs.temperature=1.0 \
  actor_rollout_ref.rollout.val_kwargs.top_p=1.0 \
  "actor_rollout_ref.rollout.tensor_model_parallel_size=$ROLLOUT_TP" actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
  actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true \
  "trainer.n_gpus_per_node=$NDEVICES_PER_NODE" "trainer.nnodes=$NNODES" "trainer.total_training_steps=$TOTAL_STEPS" \
  trainer.test_freq=20 trainer.save_freq=20 "trainer.project_name=$PROJECT_NAME" \
  "trainer.experiment_name=$EXPERIMENT_NAME" \
  "$@"
