#!/usr/bin/env bash
# The storage cache (tensor/allocator.h) side by side: build A (before it) and build B (with it),
# interleaved, on 1 and 2 threads: tokens/s of bench_gpt, and minor page faults and max RSS of runs of
# 2 and 5 steps (their difference / 3 = fresh page faults per step).
#
#   bash bench/storage_cache_ab.sh A_BUILD B_BUILD [rounds]
set -u
A=$1; B=$2; rounds=${3:-2}
data="$(cd "$(dirname "$0")/.." && pwd)/tests/data/fables.txt"
cfg="--layers 6 --hidden 512 --heads 8 --seq 512 --vocab 8192 --batch 4 --data $data"
for r in $(seq $rounds); do
  for side in A B; do
    d=$A; [ $side = B ] && d=$B
    for t in 1 2; do
      for steps in 2 5; do
        out=$( { OPENBLAS_NUM_THREADS=$t /usr/bin/time -f "%R %M" $d/bench/bench_gpt train --threads $t --steps $steps $cfg; } 2>&1 )
        tps=$(echo "$out" | grep -o '[0-9.]* tokens/s' | head -1)
        tm=$(echo "$out" | tail -1)
        echo "round $r $side threads $t steps $steps: $tps faults/maxRSS(KiB) $tm"
      done
    done
  done
done
