#!/usr/bin/env bash
# Fused vs unfused attention (--attention), interleaved in one run:
#  1. the attention core alone (bench_gpt attention: forward + backward of [4, 12, S, 64] f32, the
#     best of 3 rounds each, fused and unfused alternating), S = 512 and 1024, 1 and 2 threads:
#     time and the storage cache's peak bytes in use above the inputs;
#  2. the GPT-2 small shape (124 M: L12 d768 h12 T512 V50257 B4), 2 threads, 3 steps (the first
#     excluded from tokens/s), fused unfused fused unfused: tokens/s and max RSS.
#
#   bash bench/attention_fused.sh [BUILD_DIR]        (about 10 minutes here)
B=${1:-build}
data="$(cd "$(dirname "$0")/.." && pwd)/tests/data/fables.txt"
for S in 512 1024; do
  for t in 1 2; do
    OPENBLAS_NUM_THREADS=$t $B/bench/bench_gpt attention --threads $t --seq $S --batch 4 --heads 12 --hidden 768 --steps 3 | tail -1
  done
done
cfg="--layers 12 --hidden 768 --heads 12 --seq 512 --vocab 50257 --batch 4 --data $data"
for attention in fused unfused fused unfused; do
  out=$( { OPENBLAS_NUM_THREADS=2 /usr/bin/time -f "%M" $B/bench/bench_gpt train --threads 2 --steps 3 --attention $attention $cfg; } 2>&1 )
  echo "$attention threads 2: $(echo "$out" | grep -o '[0-9.]* tokens/s.*' | head -1) | $(echo "$out" | grep -o 'kept after forward.*') | maxRSS $(( $(echo "$out" | tail -1) / 1024 )) MiB"
done
