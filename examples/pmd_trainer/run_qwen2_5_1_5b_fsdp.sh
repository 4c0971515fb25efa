#!/usr/bin/env bash
# PMD | GSM8K | Qwen2.5-1.5B-Instruct | vLLM rollout | FSDP training | GPU
# The REC paper's GSM8K setting with a PMD preset: this script only picks the preset and runs
# examples/rec_trainer/run_qwen2_5_1_5b_fsdp.sh, where the setting and every other knob (MODEL_PATH,
# INFER_BACKEND, NDEVICES_PER_NODE, SYNC_INTERVAL, SYNC_OFFSET, ...) are.
# Not OpenKimi's setting (batch 512 in mini-batches of 32): the PMD presets keep OpenKimi's 16 optimizer
# updates per batch (96 prompts in 16 mini-batches of 6 here); everything else is the REC paper's.
#
#   examples/data_preprocess/prepare_data.sh gsm8k
#   PRESET=pmd_mean bash examples/pmd_trainer/run_qwen2_5_1_5b_fsdp.sh [HYDRA_OVERRIDES...]
#
# DRY_RUN=1 only composes and validates the command line (no GPU).
set -euo pipefail
source "$(dirname "$0")/../common.bash"

# ---- user-adjustable ----
PRESET=${PRESET:-pmd_mean}                    # pmd_mean | pmd_partition
# ---- end user-adjustable ----

require_choice PRESET "$PRESET" pmd_mean pmd_partition
PRESET=$PRESET exec bash "$(dirname "$0")/../rec_trainer/run_qwen2_5_1_5b_fsdp.sh" "$@"
