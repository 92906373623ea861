#!/usr/bin/env bash
# Sharding stage 3's parameter prefetch (--prefetch-params) on 4 MPI processes, dp=4, beside stages
# 0, 1 and 2 with and without the overlapped gradient reduction (--overlap-grad-reduce): the model
# of bench/grad_overlap.sh (GPT-2, hidden 256, 4 layers, 3.2 M parameters, the addition task's
# 12-token sequences, 4 sequences per rank per step), whose parameters and gradients are large
# against its compute. Each round runs every configuration once, one at a time (interleaved; even
# rounds in reverse order); each run prints the training loop's tokens/s ("done:" line, first steps
# included). WHICH=stage3 runs
# only stage 3 without and with prefetch; SHARDWISE_COMM_CHECKS=0 in the environment turns the
# collectives' call checks off (each start's signature exchange is a blocking MPI_Allgather).
#
#   bash bench/zero3_prefetch.sh [BUILD_DIR=build] [ROUNDS=3] [STEPS=30] [WHICH=all|stage3]
set -euo pipefail
B=${1:-build}; ROUNDS=${2:-3}; STEPS=${3:-30}; WHICH=${4:-all}
cfg="--mesh dp=4 --layers 4 --hidden 256 --heads 4 --global-batch 16 --accumulation 1 --steps $STEPS --eval-every 0
     --warmup 2 --progress none --grad-bucket-mb 4 --sharding-layout v2"
runs=("--sharding-stage 0 --overlap-grad-reduce off" "--sharding-stage 0 --overlap-grad-reduce on"
      "--sharding-stage 1 --overlap-grad-reduce off" "--sharding-stage 1 --overlap-grad-reduce on"
      "--sharding-stage 2 --overlap-grad-reduce off" "--sharding-stage 2 --overlap-grad-reduce on"
      "--sharding-stage 3 --prefetch-params 0" "--sharding-stage 3 --prefetch-params 1")
[ "$WHICH" = stage3 ] && runs=("${runs[@]:6}")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for round in $(seq "$ROUNDS"); do
  order=("${runs[@]}")  # even rounds run the configurations in reverse: no one always runs first
  if (( round % 2 == 0 )); then order=(); for (( i=${#runs[@]}-1; i>=0; i-- )); do order+=("${runs[$i]}"); done; fi
  for run in "${order[@]}"; do
    rm -rf "$dir/run"
    # shellcheck disable=SC2086
    out=$(OPENBLAS_NUM_THREADS=1 nice mpirun --allow-run-as-root --oversubscribe -np 4 \
          ${SHARDWISE_COMM_CHECKS:+-x SHARDWISE_COMM_CHECKS} "$B/bin/shardwise" train $cfg \
          $run --run-dir "$dir/run" 2>&1)
    tps=$(echo "$out" | grep "^done:" | grep -o "[0-9]* tokens/s" || echo "failed")
    echo "round $round $run: $tps"
  done
done
