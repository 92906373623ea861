#!/usr/bin/env bash
# Where the step-time model is off on this machine (docs/planner.md), instruction type by
# instruction type: `shardwise plan --predict --json`'s `by_op` (the slowest pipeline rank's
# predicted seconds a step per type) beside `train --profile`'s trace of the same run (each type's
# measured seconds a step on rank 0, steps after the first 2). One rank with one kernel thread
# (OPENBLAS_NUM_THREADS=1), as calibrate measures it. Prints a table per configuration, largest
# measured first: predicted ms, measured ms, ratio.
#
#   bash bench/predict_per_op.sh [BUILD_DIR=build] [STEPS=8] [CONFIG ...]
set -euo pipefail
B=${1:-build}; STEPS=${2:-8}
shift $(( $# > 2 ? 2 : $# ))
root=$(cd "$(dirname "$0")/.." && pwd)
sw="$B/bin/shardwise"
base="--layers 2 --heads 4 --seq 128 --data $root/tests/data/fables.txt --eval-every 0 --progress none --warmup 0"
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=("--mesh dp=1 --hidden 256 --global-batch 4" "--mesh tp=2 --hidden 256 --global-batch 4")
export OPENBLAS_NUM_THREADS=1
"$sw" calibrate --show > /dev/null 2>&1 || "$sw" calibrate > /dev/null
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for c in "${configs[@]}"; do
  # shellcheck disable=SC2086
  "$sw" plan --predict --json $base $c > "$dir/pred.json"
  rm -rf "$dir/run"
  # shellcheck disable=SC2086
  nice "$sw" train $base $c --steps "$STEPS" --run-dir "$dir/run" --profile > /dev/null
  echo "== $c"
  python3 - "$dir/pred.json" "$dir/run/trace.json" "$STEPS" <<'PY'
import collections, json, sys
pred = json.load(open(sys.argv[1]))
trace = json.load(open(sys.argv[2]))["traceEvents"]
steps = int(sys.argv[3])
# Rank 0's events inside its steps after the first 2 (warm-up), by name.
ev = [e for e in trace if e.get("ph") == "X" and e.get("tid") == 0]
step_spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") == "step")
kept = step_spans[2:]
meas = collections.Counter()
for e in ev:
    # collectives run inside a reshard or the optimizer, which count them already
    if e.get("cat") in ("step", "collective") or not any(a <= e["ts"] < b for a, b in kept):
        continue
    name = e["name"] if e.get("cat") != "optimizer" else "optimizer adamw"
    meas[name] += e["dur"] / 1e3 / len(kept)
step_ms = sum(b - a for a, b in kept) / 1e3 / len(kept)
by_op = {k: v * 1e3 for k, v in pred["by_op"].items()}
print(f"{'type':<28} {'predicted ms':>12} {'measured ms':>12} {'pred/meas':>9}")
for name in sorted(set(meas) | set(by_op), key=lambda n: -meas.get(n, 0)):
    p, m = by_op.get(name, 0.0), meas.get(name, 0.0)
    print(f"{name:<28} {p:12.3f} {m:12.3f} {p / m if m else float('nan'):9.2f}")
print(f"{'step':<28} {pred['step_time_s'] * 1e3:12.3f} {step_ms:12.3f} {pred['step_time_s'] * 1e3 / step_ms:9.2f}")
PY
done
