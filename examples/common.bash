# Shared by the example run scripts (sourced, not run; not a `run_*.sh`, so verl's example-naming
# check does not apply to it).
#
# run_main_ppo ARGS...: runs stock `python3 -m verl.trainer.main_ppo` with the given Hydra arguments.
#   DRY_RUN=1      only composes them through main_ppo's Hydra search path and runs every startup check
#                  (`verl-offpolicy check`): no GPU, no data, no model download;
#   DRY_RUN=print  prints the arguments, one a line, and runs nothing (the tests compose them in-process
#                  and compare them with the papers' tables).
# require_preset NAME: exits 2 with the allowed values unless NAME is an algorithm preset.
# require_choice VAR VALUE ALLOWED...: exits 2 with the allowed values unless VALUE is one of ALLOWED.

PRESETS=$(python3 -c "from verl_offpolicy.cli import preset_names; print(' '.join(preset_names()))")

require_preset() {
  local preset=$1
  case " $PRESETS " in
    *" $preset "*) ;;
    *) echo "unknown PRESET '$preset'; allowed: $PRESETS" >&2; exit 2 ;;
  esac
}

require_choice() {
  local var=$1 value=$2
  shift 2
  local allowed
  for allowed in "$@"; do
    [ "$value" = "$allowed" ] && return 0
  done
  echo "unknown $var '$value'; allowed: $*" >&2
  exit 2
}

run_main_ppo() {
  case "${DRY_RUN:-0}" in
    print) printf '%s\n' "$@" ;;
    1) verl-offpolicy check "$@" ;;
    0)
      echo "+ python3 -m verl.trainer.main_ppo $*"
      python3 -m verl.trainer.main_ppo "$@"
      ;;
    *) echo "unknown DRY_RUN '${DRY_RUN}'; allowed: 0 1 print" >&2; exit 2 ;;
  esac
}
