#!/usr/bin/env bash
# The storage cache at the GPT-2 small shape (124 M parameters, T512, B4, 2 threads): build A (before
# it) and build B (with it), interleaved A B A B; runs of 2 and 4 steps (fresh page faults per step =
# the difference of their minor-fault counts / 2), tokens/s and max RSS. About 10 minutes here.
#
#   bash bench/storage_cache_124m.sh A_BUILD B_BUILD
A=${1:?build A}; B=${2:?build B}
data="$(cd "$(dirname "$0")/.." && pwd)/tests/data/fables.txt"
cfg="--layers 12 --hidden 768 --heads 12 --seq 512 --vocab 50257 --batch 4 --data $data"
for side in A B A B; do
  d=$A; [ $side = B ] && d=$B
  for steps in 2 4; do
    out=$( { OPENBLAS_NUM_THREADS=2 /usr/bin/time -f "%R %M" $d/bench/bench_gpt train --threads 2 --steps $steps $cfg; } 2>&1 )
    echo "$side threads 2 steps $steps: $(echo "$out" | grep -o '[0-9.]* tokens/s.*' | head -1) | faults maxRSS(KiB) $(echo "$out" | tail -1)"
  done
done
