#!/usr/bin/env bash
# Prepare a dataset in verl's RLHF parquet format with verl's own preprocessing scripts.
#   examples/data_preprocess/prepare_data.sh gsm8k|math|guru_math [DATA_DIR]      (default DATA_DIR: ~/data)
# gsm8k and math run verl's examples/data_preprocess/{gsm8k,math_dataset}.py (from $VERL_REPO if set,
# otherwise fetched from verl's repository at $VERL_REF, default v0.9.1). guru_math converts
# LLM360/guru-RL-92k's math subset (examples/data_preprocess/prepare_guru_math.py).
set -euo pipefail
DATASET=${1:?usage: examples/data_preprocess/prepare_data.sh gsm8k|math|guru_math [DATA_DIR]}
DATA_DIR=${2:-$HOME/data}
VERL_REF=${VERL_REF:-v0.9.1}

verl_script() {
  local name=$1
  if [ -n "${VERL_REPO:-}" ]; then echo "$VERL_REPO/examples/data_preprocess/$name"; return; fi
  local dst=${XDG_CACHE_HOME:-$HOME/.cache}/verl-offpolicy/verl-$VERL_REF/$name
  if [ ! -f "$dst" ]; then
    mkdir -p "$(dirname "$dst")"
    curl -fsSL --max-time 60 -o "$dst" \
      "https://raw.githubusercontent.com/volcengine/verl/$VERL_REF/examples/data_preprocess/$name"
  fi
  echo "$dst"
}

case $DATASET in
  gsm8k) python3 "$(verl_script gsm8k.py)" --local_save_dir "$DATA_DIR/gsm8k" ;;
  math) python3 "$(verl_script math_dataset.py)" --local_save_dir "$DATA_DIR/math" ;;
  guru_math) python3 "$(dirname "$0")/prepare_guru_math.py" --local_save_dir "$DATA_DIR/guru_math" ;;
  *) echo "unknown dataset '$DATASET'; allowed: gsm8k, math, guru_math" >&2; exit 2 ;;
esac
