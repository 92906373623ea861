#!/usr/bin/env bash
# Sharding stages 0 / 1 / 2 on a 105 M-parameter GPT-2 (14 layers, hidden 768, vocab 8192, seq 128,
# one sequence per dp rank per step), ranks as threads of one process: this rank's optimizer bytes
# (printed by `shardwise train` at the start; stage 0 from the formula 8 x Psi) and the process's
# peak RSS (/usr/bin/time -v), 2 steps per run, one run at a time.
#
#   bash bench/sharding_memory.sh [BUILD_DIR] [DP_LIST] [STAGES]
B=${1:-build}; DPS=${2:-"1 2 4"}; STAGES=${3:-"0 1 2"}
cfg="--layers 14 --hidden 768 --heads 12 --seq 128 --vocab 8192 --steps 2 --micro-batch 1 --accumulation 1 --eval-every 0 --warmup 1 --progress none"
for dp in $DPS; do
  for stage in $STAGES; do
    dir=$(mktemp -d)
    out=$( { OPENBLAS_NUM_THREADS=1 nice /usr/bin/time -v $B/bin/shardwise train --mesh dp=$dp --global-batch $dp \
             --sharding-stage $stage --sharding-layout v2 $cfg --run-dir $dir; } 2>&1 )
    bytes=$(echo "$out" | grep -o '[0-9]* bytes of optimizer' | grep -o '^[0-9]*')
    rss=$(echo "$out" | grep 'Maximum resident' | grep -o '[0-9]*$')
    wall=$(echo "$out" | grep 'Elapsed (wall' | awk '{print $NF}')
    echo "dp=$dp stage=$stage optimizer_bytes_per_rank=${bytes:-formula} peak_rss_kib=$rss wall=$wall"
    rm -rf "$dir"
  done
done
