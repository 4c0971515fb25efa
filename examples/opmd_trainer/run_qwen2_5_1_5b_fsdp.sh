#!/usr/bin/env bash
# OPMD | GSM8K | Qwen2.5-1.5B-Instruct | vLLM rollout | FSDP training | GPU
# The setting of Trinity-RFT's own OPMD example (examples/opmd_gsm8k/opmd_gsm8k.yaml +
# train_opmd_gsm8k.yaml, read at commit 2eb10b9): preset `opmd` (mean baseline), τ = 4.0 (the config's
# value; its comment says 1.0), KL-to-reference loss kl_loss_type=mse with coefficient 0.001 (no KL in
# the reward), entropy bonus 0, AdamW with betas (0.0, 0.95) and lr 2e-6 constant without warm-up, grad
# clip 1.0, K = 8 responses per prompt, 96 prompts per step, responses up to 1024 tokens, temperature
# 1.0, rollout weights synchronised every 10 steps (SYNC_INTERVAL defaults to 10 here). τ matters in this
# setting: with the KL loss beside it, 1/(1+τ) weighs the policy term against the KL term (alone it
# would be a loss scale that Adam normalises away). Not from Trinity's files (ours): 160 steps, prompts
# up to 256 tokens, evaluation every 20 steps. The REC paper's OPMD run (`opmd_kimi`) is the REC GSM8K
# script with PRESET=opmd_kimi.
#
#   examples/data_preprocess/prepare_data.sh gsm8k
#   bash examples/opmd_trainer/run_qwen2_5_1_5b_fsdp.sh [HYDRA_OVERRIDES...]
#
# DRY_RUN=1 only composes and validates the command line (no GPU).
set -euo pipefail
source "$(dirname "$0")/../common.bash"

# ---- user-adjustable ----
OPMD_TAU=${OPMD_TAU:-4.0}                   # τ of the opmd estimator and loss
KL_LOSS_COEF=${KL_LOSS_COEF:-0.001}
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-1.5B-Instruct}
DATA_DIR=${DATA_DIR:-$HOME/data}
INFER_BACKEND=${INFER_BACKEND:-vllm}        # vllm | sglang
NNODES=${NNODES:-1}
NDEVICES_PER_NODE=${NDEVICES_PER_NODE:-8}
ROLLOUT_TP=${ROLLOUT_TP:-1}
SYNC_INTERVAL=${SYNC_INTERVAL:-10}          # s: rollout weights refreshed every s steps
SYNC_OFFSET=${SYNC_OFFSET:-0}               # d: feedback delayed by d steps
TOTAL_STEPS=${TOTAL_STEPS:-160}
PROJECT_NAME=${PROJECT_NAME:-verl_offpolicy_gsm8k}
EXPERIMENT_NAME=${EXPERIMENT_NAME:-qwen2_5_1_5b_opmd_trinity_s${SYNC_INTERVAL}_d${SYNC_OFFSET}}
# ---- end user-adjustable ----

require_choice INFER_BACKEND "$INFER_BACKEND" vllm sglang

run_main_ppo --config-name offpolicy_trainer algorithm=opmd "algorithm.offpolicy.tau=$OPMD_TAU" \
  "algorithm.offpolicy.sync_interval=$SYNC_INTERVAL" "algorithm.offpolicy.sync_offset=$SYNC_OFFSET" \
  "data.train_files=$DATA_DIR/gsm8k/train.parquet" "data.val_files=$DATA_DIR/gsm8k/test.parquet" \
  data.train_batch_size=96 data.max_prompt_length=256 data.max_response_length=1024 \
  "actor_rollout_ref.model.path=$MODEL_PATH" actor_rollout_ref.model.use_remove_padding=true \
  actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.kl_loss_type=mse \
  "actor_rollout_ref.actor.kl_loss_coef=$KL_LOSS_COEF" actor_rollout_ref.actor.entropy_coeff=0.0 \
  actor_rollout_ref.actor.optim.lr=2e-6 "actor_rollout_ref.actor.optim.betas=[0.0,0.95]" \
  actor_rollout_ref.actor.optim.lr_warmup_steps=0 actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.0 \
  actor_rollout_ref.actor.optim.lr_scheduler_type=constant actor_rollout_ref.actor.grad_clip=1.0 \
  actor_rollout_ref.actor.use_dynamic_bsz=true actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384 \
  "actor_rollout_ref.rollout.name=$INFER_BACKEND" actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.rollout.temperature=1.0 actor_rollout_ref.rollout.top_p=1.0 \
  "actor_rollout_ref.rollout.tensor_model_parallel_size=$ROLLOUT_TP" actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
  actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true \
  "trainer.n_gpus_per_node=$NDEVICES_PER_NODE" "trainer.nnodes=$NNODES" "trainer.total_training_steps=$TOTAL_STEPS" \
  trainer.test_freq=20 trainer.save_freq=20 "trainer.project_name=$PROJECT_NAME" \
  "trainer.experiment_name=$EXPERIMENT_NAME" \
  "$@"
