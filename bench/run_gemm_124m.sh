#!/usr/bin/env bash
# The GPT-2 small shape (L12 d768 h12 T512 V50257 B4, 124 M parameters) with each GEMM backend:
# training tokens/s and peak RSS, interleaved (each round runs every backend once). ~8 GB per run:
# run it alone, with nice. Compare within one run only (shared machine).
#
#   bash bench/run_gemm_124m.sh [build] [rounds] [steps] [threads] [backends]
set -euo pipefail
build=${1:-build}
rounds=${2:-2}
steps=${3:-3}
threads=${4:-2}
backends=${5:-openblas openblas-haswell onednn}
root=$(cd "$(dirname "$0")/.." && pwd)
cfg="--layers 12 --hidden 768 --heads 12 --seq 512 --vocab 50257 --batch 4 --data $root/tests/data/fables.txt"
echo "== GPT-2 small shape, $threads threads, $steps steps ($(date -u '+%F %H:%M') UTC; load $(cut -d' ' -f1-3 /proc/loadavg))"
for r in $(seq "$rounds"); do
  for b in $backends; do
    out=$( { OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads /usr/bin/time -f "%M" \
             "$build/bench/bench_gpt" train --gemm "$b" --threads "$threads" --steps "$steps" $cfg; } 2>&1 )
    echo "round $r $b: $(grep tokens/s <<<"$out" | sed -E 's/.*: ([0-9.]+ tokens\/s).*/\1/'), max RSS $(( $(tail -1 <<<"$out") / 1024 )) MiB"
  done
done
echo "   load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
