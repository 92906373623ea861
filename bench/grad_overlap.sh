#!/usr/bin/env bash
# Gradient reduction overlapped with the backward (--overlap-grad-reduce) on 4 MPI processes, dp=4:
# sharding stages 0, 1 and 2 with the reduction left to the graph / ShardedOptimizer (off), the
# buckets reduced after the backward (after) and started during it (on). A GPT-2 whose gradients
# are large against its compute (hidden 256, 4 layers, 3.2 M parameters = 12.2 MiB of f32
# gradients per rank, the addition task's 12-token sequences, 4 sequences per rank per step), so
# the gradient traffic is a large part of a step. ROUNDS interleaved rounds; each run prints the
# training loop's tokens/s ("done:" line), first steps included.
#
#   bash bench/grad_overlap.sh [BUILD_DIR=build] [ROUNDS=3] [STEPS=30] [MODES="off after on"]
set -euo pipefail
B=${1:-build}; ROUNDS=${2:-3}; STEPS=${3:-30}; MODES=${4:-"off after on"}
cfg="--mesh dp=4 --layers 4 --hidden 256 --heads 4 --global-batch 16 --accumulation 1 --steps $STEPS --eval-every 0
     --warmup 2 --progress none --grad-bucket-mb 4"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for round in $(seq "$ROUNDS"); do
  for stage in 0 1 2; do
    for mode in $MODES; do
      rm -rf "$dir/run"
      out=$(OPENBLAS_NUM_THREADS=1 nice mpirun --allow-run-as-root --oversubscribe -np 4 "$B/bin/shardwise" train $cfg \
            --sharding-stage "$stage" --sharding-layout v2 --overlap-grad-reduce "$mode" --run-dir "$dir/run" 2>&1)
      tps=$(echo "$out" | grep "^done:" | grep -o "[0-9]* tokens/s" || echo "failed")
      echo "round $round stage $stage overlap $mode: $tps"
    done
  done
done
