#!/usr/bin/env bash
# Sharding stages 0-3 x activation recompute on a 105 M-parameter GPT-2 (14 layers, hidden 768, vocab
# 8192, seq 128, one sequence per dp rank per step), ranks as threads of one process, one run at a
# time (issue 15, points 2 and 6).
#
#   bash bench/sharding_memory.sh [BUILD_DIR] [DP_LIST] [STAGES] [RECOMPUTES] [CAP_MIB]
#
# Each run is build/bench/bench_sharding_memory (1 step): per rank, each piece planned by the
# memory plan vs measured on the Trainer (parameters, gradients, optimizer state, activations,
# stage 3's gathered parameter copies), the storage cache's peak in use, and the process's peak RSS
# (/usr/bin/time -v). A run whose plan for the process (every rank, threads) exceeds CAP_MIB
# (default 4096: the shared development VM's budget per helper) is skipped, saying so.
B=${1:-build}; DPS=${2:-"1 2 4"}; STAGES=${3:-"0 1 2 3"}; RECOMPUTES=${4:-"none full selective"}; CAP=${5:-4096}
model="--layers 14 --hidden 768 --heads 12 --seq 128 --vocab 8192"
for dp in $DPS; do
  for stage in $STAGES; do
    for rc in $RECOMPUTES; do
      echo "=== dp=$dp stage=$stage recompute=$rc"
      plan=$($B/bin/shardwise plan --memory --json --memory-limit none --mesh dp=$dp --global-batch $dp \
               --sharding-stage $stage --sharding-layout v2 --recompute $rc $model)
      mib=$(echo "$plan" | python3 -c 'import json,sys; print(json.load(sys.stdin)["per_process"] // 1048576)')
      if [ "$mib" -gt "$CAP" ]; then echo "skipped: the plan gives the process $mib MiB > $CAP MiB"; continue; fi
      out=$( { OPENBLAS_NUM_THREADS=1 nice /usr/bin/time -v $B/bench/bench_sharding_memory --mesh dp=$dp \
               --stage $stage --layout v2 --recompute $rc $model --micro-batch 1 --steps 1; } 2>&1 )
      echo "$out" | grep -v -e '^\s' -e '^Command being timed'
      echo "peak_rss_kib=$(echo "$out" | grep 'Maximum resident' | grep -o '[0-9]*$') wall=$(echo "$out" | grep 'Elapsed (wall' | awk '{print $NF}')"
    done
  done
done
