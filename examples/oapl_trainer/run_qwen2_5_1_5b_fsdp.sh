#!/usr/bin/env bash
# OAPL | GSM8K | Qwen2.5-1.5B-Instruct | vLLM rollout | FSDP training | GPU
# The REC paper's GSM8K setting with the oapl preset (regression on the optimal advantage against the lagged
# policy, β1 = 1, β2 = 1e-3): this script only picks the preset and runs
# examples/rec_trainer/run_qwen2_5_1_5b_fsdp.sh, where the setting and every other knob (MODEL_PATH,
# INFER_BACKEND, NDEVICES_PER_NODE, SYNC_INTERVAL, SYNC_OFFSET, ...) are.
#
#   examples/data_preprocess/prepare_data.sh gsm8k
#   SYNC_INTERVAL=16 SYNC_OFFSET=8 bash examples/oapl_trainer/run_qwen2_5_1_5b_fsdp.sh [HYDRA_OVERRIDES...]
#
# DRY_RUN=1 only composes and validates the command line (no GPU).
set -euo pipefail
source "$(dirname "$0")/../common.bash"

# ---- user-adjustable ----
PRESET=${PRESET:-oapl}                        # oapl
# ---- end user-adjustable ----

require_choice PRESET "$PRESET" oapl
PRESET=$PRESET exec bash "$(dirname "$0")/../rec_trainer/run_qwen2_5_1_5b_fsdp.sh" "$@"
