#!/bin/bash
# A/B of the overlapped mode at (1, 1) between a past commit and this checkout, in one invocation:
# rounds of (past commit, this checkout), each `bench_overlap.py` at (1, 1) (colocated and overlapped).
#
#     bash benchmarks/ab_overlap.sh COMMIT [ROUNDS=2] [OUT=/tmp/vo-ab-overlap]
#
# The past commit runs from a temporary git worktree with PYTHONPATH pointing at it (main_ppo and its Ray
# workers inherit it, so every process imports that commit's package); its bench_overlap.py is the one
# of that commit (run with --only "colocated s1d1" "overlapped s1d1" when it has the option). Each run's
# table is copied to OUT/{old,new}_<round>.md; this checkout's results files are restored afterwards.
set -u
COMMIT=${1:?usage: ab_overlap.sh COMMIT [ROUNDS] [OUT]}
ROUNDS=${2:-2}
OUT=${3:-/tmp/vo-ab-overlap}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$HERE/.venv/bin/python}
OLD=$(mktemp -d /tmp/vo-ab-worktree-XXXXXX)
mkdir -p "$OUT"
git -C "$HERE" worktree add --detach "$OLD" "$COMMIT" >/dev/null || exit 1
trap 'git -C "$HERE" worktree remove --force "$OLD"; git -C "$HERE" checkout -- benchmarks/results/overlap.md benchmarks/results/overlap_reward_wallclock.png' EXIT
ONLY=()
grep -q -- '"--only"' "$OLD/benchmarks/bench_overlap.py" && ONLY=(--only "colocated s1d1" "overlapped s1d1")
for round in $(seq 1 "$ROUNDS"); do
  echo "== round $round: $COMMIT ($(date +%T))"
  (cd "$OLD" && PYTHONPATH="$OLD" timeout 1800 "$PY" benchmarks/bench_overlap.py --settings 1,1 "${ONLY[@]}" \
     > "$OUT/old_$round.log" 2>&1; echo "exit $?"; cp benchmarks/results/overlap.md "$OUT/old_$round.md")
  echo "== round $round: this checkout ($(date +%T))"
  (cd "$HERE" && timeout 1800 "$PY" benchmarks/bench_overlap.py --settings 1,1 --plot-setting 1,1 \
     > "$OUT/new_$round.log" 2>&1; echo "exit $?"; cp benchmarks/results/overlap.md "$OUT/new_$round.md")
done
echo "== done ($(date +%T)); tables in $OUT"
