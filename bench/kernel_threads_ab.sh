#!/usr/bin/env bash
# Kernel threads (tensor/parallel.h) side by side, issue 18 point 5: build A (main: only GEMMs use a
# rank's threads) and build B (every heavy kernel does), interleaved A B per round, on 1 and 2 threads:
# tokens/s of bench_gpt on the small config (L4 d256 h4 T256 V256 B8) and, with --124m, the GPT-2
# small shape (L12 d768 h12 T512 V50257 B4). Then the share of step time outside the GEMM kernels
# from `shardwise train --profile` on the small config, 2 threads, A and B.
#
#   bash bench/kernel_threads_ab.sh A_BUILD B_BUILD [rounds] [--124m]
set -u
A=$(cd "${1:?build A}" && pwd); B=$(cd "${2:?build B}" && pwd); rounds=${3:-3}; big=${4:-}
root="$(cd "$(dirname "$0")/.." && pwd)"
data="$root/tests/data/fables.txt"
small="--layers 4 --hidden 256 --heads 4 --seq 256 --vocab 256 --batch 8"
large="--layers 12 --hidden 768 --heads 12 --seq 512 --vocab 50257 --batch 4"
configs=("small|$small|6")
[ "$big" = --124m ] && configs+=("124m|$large|3")
for r in $(seq "$rounds"); do
  for entry in "${configs[@]}"; do
    IFS='|' read -r name cfg steps <<<"$entry"
    for t in 1 2; do
      for side in A B; do
        d=$A; [ $side = B ] && d=$B
        line=$(OPENBLAS_NUM_THREADS=$t "$d/bench/bench_gpt" train --threads "$t" --steps "$steps" $cfg --data "$data" |
               grep -o '[0-9.]* tokens/s (median step [0-9.]* ms')
        echo "round $r $name threads $t $side: $line"
      done
    done
  done
done
# Outside-GEMM share: the profile's "GEMM ...: X% of step time" line (the rest is every other op,
# reshards, collectives and the optimizer).
tmp=$(mktemp -d)
for side in A B; do
  d=$A; [ $side = B ] && d=$B
  out=$(cd "$tmp" && OPENBLAS_NUM_THREADS=2 SHARDWISE_GEMM=openblas "$d/bin/shardwise" train --mesh dp=1 --layers 4 \
        --hidden 256 --heads 4 --seq 256 --vocab 256 --global-batch 8 --steps 4 --data "$data" --data-format bytes \
        --eval-every 0 --progress none --profile --run-dir "$tmp/run$side" 2>&1)
  echo "profile $side threads 2: $(echo "$out" | grep -o 'GEMM (matmul and matmul_grad kernels): [0-9.]*% of step time'),"\
       "$(echo "$out" | grep -o '[0-9.]* ms per step')"
  echo "$out" | grep -E '^  (op|optimizer) ' | head -12 | sed "s/^/  $side /"
done
rm -rf "$tmp"
