#!/usr/bin/env bash
# AGRO | GSM8K | Qwen2.5-1.5B-Instruct | vLLM rollout | FSDP training | GPU
# The REC paper's GSM8K setting with a AGRO preset: this script only picks the preset and runs
# examples/rec_trainer/run_qwen2_5_1_5b_fsdp.sh, where the setting and every other knob (MODEL_PATH,
# INFER_BACKEND, NDEVICES_PER_NODE, SYNC_INTERVAL, SYNC_OFFSET, ...) are.
# Not the AGRO paper's setting (not recoverable from our sources); β = 0.1 is this package's default
# (algorithm.offpolicy.beta=... to change it).
#
#   examples/data_preprocess/prepare_data.sh gsm8k
#   PRESET=agro bash examples/agro_trainer/run_qwen2_5_1_5b_fsdp.sh [HYDRA_OVERRIDES...]
#
# DRY_RUN=1 only composes and validates the command line (no GPU).
set -euo pipefail
source "$(dirname "$0")/../common.bash"

# ---- user-adjustable ----
PRESET=${PRESET:-agro}                    # agro | agro_onpolicy
# ---- end user-adjustable ----

require_choice PRESET "$PRESET" agro agro_onpolicy
PRESET=$PRESET exec bash "$(dirname "$0")/../rec_trainer/run_qwen2_5_1_5b_fsdp.sh" "$@"
