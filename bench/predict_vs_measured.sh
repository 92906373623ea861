#!/usr/bin/env bash
# The step-time model against measured steps on this machine (docs/planner.md): for each
# configuration, `shardwise plan --predict` on this machine's calibration (`shardwise calibrate`,
# measured first when none is cached) and a short `shardwise train` on threads, whose step time is
# the median difference of metrics.jsonl's elapsed_s between consecutive steps after the first 3.
# One device is one rank with one kernel thread (OPENBLAS_NUM_THREADS=1), as calibrate measures it.
# Prints a row per configuration (predicted, measured, error = predicted / measured - 1) and the
# median absolute error.
#
#   bash bench/predict_vs_measured.sh [BUILD_DIR=build] [STEPS=12]
set -euo pipefail
B=${1:-build}; STEPS=${2:-12}
root=$(cd "$(dirname "$0")/.." && pwd)
sw="$B/bin/shardwise"
base="--layers 2 --heads 4 --seq 128 --data $root/tests/data/fables.txt --eval-every 0 --progress none --warmup 0"
configs=(
  "--mesh dp=1 --hidden 128 --global-batch 4"
  "--mesh dp=2 --hidden 128 --global-batch 8"
  "--mesh tp=2 --hidden 128 --global-batch 4"
  "--mesh dp=2 --hidden 128 --global-batch 8 --accumulation 2"
  "--mesh dp=1 --hidden 256 --global-batch 4"
  "--mesh tp=2 --hidden 256 --global-batch 4"
  "--mesh dp=2 --hidden 256 --global-batch 8"
  "--mesh pp=2 --hidden 128 --global-batch 8 --accumulation 4 --schedule fthenb"
  "--mesh pp=2 --hidden 128 --global-batch 8 --accumulation 4 --schedule 1f1b"
)
export OPENBLAS_NUM_THREADS=1
"$sw" calibrate --show > /dev/null 2>&1 || "$sw" calibrate > /dev/null
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
errors=()
printf "%-76s %12s %12s %8s\n" "configuration" "predicted s" "measured s" "error"
for c in "${configs[@]}"; do
  # shellcheck disable=SC2086
  pred=$("$sw" plan --predict --json $base $c | python3 -c 'import json,sys; print(json.load(sys.stdin)["step_time_s"])')
  rm -rf "$dir/run"
  # shellcheck disable=SC2086
  nice "$sw" train $base $c --steps "$STEPS" --run-dir "$dir/run" > /dev/null
  meas=$(python3 - "$dir/run/metrics.jsonl" <<'PY'
import json, statistics, sys
t = [json.loads(l)["elapsed_s"] for l in open(sys.argv[1]) if '"elapsed_s"' in l]
print(statistics.median([b - a for a, b in zip(t[3:], t[4:])]))
PY
)
  err=$(python3 -c "print(f'{$pred / $meas - 1:+.1%}')")
  errors+=("$(python3 -c "print(abs($pred / $meas - 1))")")
  printf "%-76s %12.5f %12.5f %8s\n" "$c" "$pred" "$meas" "$err"
done
python3 -c "import statistics, sys; print(f'median absolute error: {statistics.median(map(float, sys.argv[1:])):.1%}')" "${errors[@]}"
