# Shared by the recipe scripts (sourced, not run).
# run_main_ppo ARGS...: runs stock verl.trainer.main_ppo with the given Hydra arguments, or, with
# DRY_RUN=1, only composes them through main_ppo's Hydra search path and validates them
# (`verl-offpolicy check`): no GPU, no data, no model download. DRY_RUN=print prints the arguments,
# one a line, without running anything (the tests compare them with the papers' tables).

# Shared settings, each overridable from the environment.
DATA_DIR=${DATA_DIR:-$HOME/data}
NGPUS=${NGPUS:-8}
SYNC_INTERVAL=${SYNC_INTERVAL:-1}
SYNC_OFFSET=${SYNC_OFFSET:-0}
SCHEDULE=("algorithm.offpolicy.sync_interval=$SYNC_INTERVAL" "algorithm.offpolicy.sync_offset=$SYNC_OFFSET")

PRESETS=$(python3 -c "from verl_offpolicy.cli import preset_names; print(' '.join(preset_names()))")

require_preset() {
  local preset=$1
  case " $PRESETS " in
    *" $preset "*) ;;
    *) echo "unknown preset '$preset'; allowed: $PRESETS" >&2; exit 2 ;;
  esac
}

run_main_ppo() {
  if [ "${DRY_RUN:-0}" = print ]; then
    printf '%s\n' "$@"
  elif [ "${DRY_RUN:-0}" = 1 ]; then
    verl-offpolicy check "$@"
  else
    echo "+ python3 -m verl.trainer.main_ppo $*"
    python3 -m verl.trainer.main_ppo "$@"
  fi
}
