#!/usr/bin/env bash
# OPMD on GSM8K with Qwen2.5-1.5B-Instruct on FSDP, in the setting of Trinity-RFT's own OPMD example
# (examples/opmd_gsm8k/opmd_gsm8k.yaml + train_opmd_gsm8k.yaml, read at commit 2eb10b9): preset `opmd`
# (mean baseline), τ = 4.0 (the config's value; its comment says 1.0), KL-to-reference loss
# kl_loss_type=mse with coefficient 0.001 (no KL in the reward), entropy bonus 0, AdamW with betas
# (0.0, 0.95) and lr 2e-6 constant without warm-up, grad clip 1.0, K = 8 responses per prompt, 96 prompts
# per step, responses up to 1024 tokens, temperature 1.0, rollout weights synchronised every 10 steps
# (SYNC_INTERVAL defaults to 10 here). τ matters in this setting: with the KL loss beside it, 1/(1+τ)
# weighs the policy term against the KL term (alone it would be a loss scale that Adam normalises away).
# Not from Trinity's files (ours): 160 steps, prompts up to 256 tokens, evaluation every 20 steps.
#
#   recipes/prepare_data.sh gsm8k
#   recipes/gsm8k_qwen2.5-1.5b_opmd_trinity.sh [HYDRA_OVERRIDES...]
#
# DRY_RUN=1 only composes and validates the command line.
set -euo pipefail
SYNC_INTERVAL=${SYNC_INTERVAL:-10}
source "$(dirname "$0")/_common.sh"

MODEL=${MODEL:-Qwen/Qwen2.5-1.5B-Instruct}

run_main_ppo --config-name offpolicy_trainer algorithm=opmd algorithm.offpolicy.tau=4.0 "${SCHEDULE[@]}" \
  "data.train_files=$DATA_DIR/gsm8k/train.parquet" "data.val_files=$DATA_DIR/gsm8k/test.parquet" \
  data.train_batch_size=96 data.max_prompt_length=256 data.max_response_length=1024 \
  "actor_rollout_ref.model.path=$MODEL" actor_rollout_ref.model.use_remove_padding=true \
  actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.kl_loss_type=mse \
  actor_rollout_ref.actor.kl_loss_coef=0.001 actor_rollout_ref.actor.entropy_coeff=0.0 \
  actor_rollout_ref.actor.optim.lr=2e-6 "actor_rollout_ref.actor.optim.betas=[0.0,0.95]" \
  actor_rollout_ref.actor.optim.lr_warmup_steps=0 actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.0 \
  actor_rollout_ref.actor.optim.lr_scheduler_type=constant actor_rollout_ref.actor.grad_clip=1.0 \
  actor_rollout_ref.actor.use_dynamic_bsz=true actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384 \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.rollout.temperature=1.0 actor_rollout_ref.rollout.top_p=1.0 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
  actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true \
  "trainer.n_gpus_per_node=$NGPUS" trainer.nnodes=1 trainer.total_training_steps=160 \
  trainer.test_freq=20 trainer.save_freq=20 trainer.project_name=verl-offpolicy-gsm8k \
  "trainer.experiment_name=qwen2.5-1.5b-opmd-trinity-s${SYNC_INTERVAL}-d${SYNC_OFFSET}" \
  "$@"
