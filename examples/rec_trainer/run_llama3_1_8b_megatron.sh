#!/usr/bin/env bash
# REC family | MATH | Llama-3.1-8B-Instruct | vLLM rollout | Megatron training | GPU
# The REC paper's MATH setting ("Group-Relative REINFORCE Is Secretly an Off-Policy Algorithm", Tables 1
# and 2, MATH column; its Figure 11): K = 16 responses per prompt, 64 prompts per step, one optimizer
# step per batch, AdamW (0.9, 0.999), lr 5e-7 with 40 constant warm-up steps, weight decay 0.1 (constant
# increment style), grad clip 1.0, training sampling at temperature 1.0 / top-p 1.0, evaluation at
# temperature 0.6 / top-p 1.0. Not from the paper's tables (ours): responses up to 2048 tokens, prompts
# up to 1024, TP = 4 / PP = 1, 500 steps. The AsymRE paper's MATH setting (K = 8, 16 prompts, lr 6e-8)
# is examples/asymre_trainer/run_llama3_1_8b_megatron.sh.
#
#   examples/data_preprocess/prepare_data.sh math
#   PRESET=rec_ring_nois bash examples/rec_trainer/run_llama3_1_8b_megatron.sh [HYDRA_OVERRIDES...]
#
# DRY_RUN=1 only composes and validates the command line (no GPU).
set -euo pipefail
source "$(dirname "$0")/../common.bash"

# ---- user-adjustable ----
PRESET=${PRESET:-rec_oneside_nois}          # any preset of `verl-offpolicy list`
MODEL_PATH=${MODEL_PATH:-meta-llama/Llama-3.1-8B-Instruct}
DATA_DIR=${DATA_DIR:-$HOME/data}
INFER_BACKEND=${INFER_BACKEND:-vllm}        # vllm | sglang
NNODES=${NNODES:-1}
NDEVICES_PER_NODE=${NDEVICES_PER_NODE:-8}
TRAIN_TP=${TRAIN_TP:-4}
ROLLOUT_TP=${ROLLOUT_TP:-2}
SYNC_INTERVAL=${SYNC_INTERVAL:-1}           # s: rollout weights refreshed every s steps
SYNC_OFFSET=${SYNC_OFFSET:-0}               # d: feedback delayed by d steps
TOTAL_STEPS=${TOTAL_STEPS:-500}
PROJECT_NAME=${PROJECT_NAME:-verl_offpolicy_math}
EXPERIMENT_NAME=${EXPERIMENT_NAME:-llama3_1_8b_${PRESET}_s${SYNC_INTERVAL}_d${SYNC_OFFSET}}
# ---- end user-adjustable ----

require_preset "$PRESET"
require_choice INFER_BACKEND "$INFER_BACKEND" vllm sglang

run_main_ppo --config-name offpolicy_megatron_trainer "algorithm=$PRESET" \
  "algorithm.offpolicy.sync_interval=$SYNC_INTERVAL" "algorithm.offpolicy.sync_offset=$SYNC_OFFSET" \
  "data.train_files=$DATA_DIR/math/train.parquet" "data.val_files=$DATA_DIR/math/test.parquet" \
  data.train_batch_size=64 data.max_prompt_length=1024 data.max_response_length=2048 \
  "actor_rollout_ref.model.path=$MODEL_PATH" \
  actor_rollout_ref.actor.optim.lr=5e-7 actor_rollout_ref.actor.optim.lr_warmup_steps=40 \
  actor_rollout_ref.actor.optim.lr_decay_style=constant actor_rollout_ref.actor.optim.weight_decay=0.1 \
  actor_rollout_ref.actor.optim.weight_decay_incr_style=constant actor_rollout_ref.actor.optim.clip_grad=1.0 \
  actor_rollout_ref.actor.use_dynamic_bsz=true actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192 \
  "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=$TRAIN_TP" \
  actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1 \
  "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=$TRAIN_TP" \
  "actor_rollout_ref.rollout.name=$INFER_BACKEND" actor_rollout_ref.rollout.n=16 \
  actor_rollout_ref.rollout.temperature=1.0 actor_rollout_ref.rollout.top_p=1.0 \
  actor_rollout_ref.rollout.val_kwargs.do_sample=true actor_rollout_ref.rollout.val_kwargs.temperature=0.6 \
  actor_rollout_ref.rollout.val_kwargs.top_p=1.0 \
  "actor_rollout_ref.rollout.tensor_model_parallel_size=$ROLLOUT_TP" actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
  actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true \
  "trainer.n_gpus_per_node=$NDEVICES_PER_NODE" "trainer.nnodes=$NNODES" "trainer.total_training_steps=$TOTAL_STEPS" \
  trainer.test_freq=50 trainer.save_freq=100 "trainer.project_name=$PROJECT_NAME" \
  "trainer.experiment_name=$EXPERIMENT_NAME" \
  "$@"
