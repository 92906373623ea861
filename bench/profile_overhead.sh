#!/usr/bin/env bash
# The cost of `shardwise train --profile` on the demo config: ROUNDS interleaved pairs of a short
# run without and with --profile; prints each run's tokens/s (the training loop) and the whole
# command's wall time (with --profile: also gathering the events and writing trace.json).
# Usage: bash bench/profile_overhead.sh [STEPS=100] [ROUNDS=6]   (from the repository root, after a build)
set -euo pipefail
steps=${1:-100}
rounds=${2:-6}
bin=build/bin/shardwise
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for round in $(seq "$rounds"); do
  for mode in off on; do
    flag=""
    [ "$mode" = on ] && flag="--profile"
    rm -rf "$dir/$mode"
    start=$(date +%s.%N)
    tps=$(nice "$bin" train --config examples/demo.toml --steps "$steps" --eval-every 0 --progress none \
          --run-dir "$dir/$mode" $flag 2>&1 | grep "^done:" | grep -o "[0-9]* tokens/s")
    end=$(date +%s.%N)
    echo "round $round $mode: $tps, wall $(echo "$end - $start" | bc) s"
  done
done
