#!/usr/bin/env bash
# GPT training throughput (issue 6): shardwise (bench_gpt) and the same model in PyTorch
# (bench/gpt_torch_throughput.py, Debian's python3-torch) side by side, interleaved, on 1 and 2
# threads; the OpenBLAS SGEMM rate on the same threads; the model FLOPs utilization of both.
#
#   bash bench/run_gpt.sh [build] [rounds] [steps]
#
# Config: layers 4, hidden 256, heads 4, seq 256, vocab 256, batch 8 (both programs' defaults).
# Each round runs shardwise then PyTorch for each thread count; a run reports the mean tokens/s of
# its steps after the first; the table gives the median over rounds (the machine is shared: compare
# within one run only).
set -euo pipefail
build=${1:-build}
rounds=${2:-3}
steps=${3:-6}
py=/usr/bin/python3
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
bench="$build/bench/bench_gpt"
[[ -x $bench ]] || { echo "run_gpt.sh: $bench is missing: cmake --build $build --target bench_gpt" >&2; exit 2; }

source "$(dirname "$0")/common.sh"  # median
tokens() { sed -E 's/.*: ([0-9.]+) tokens\/s.*/\1/'; }

echo "== GPT training throughput: layers 4, hidden 256, heads 4, seq 256, vocab 256, batch 8 ($(nproc) cores, $(date -u +%F))"
echo "   load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A sgemm sw pt
for t in 1 2; do
  line=$(OPENBLAS_NUM_THREADS=$t "$bench" sgemm --threads "$t")
  echo "$line"
  sgemm[$t]=$(sed -E 's/.*: ([0-9.]+) GFLOP\/s.*/\1/' <<<"$line")
done
flops=$(OPENBLAS_NUM_THREADS=1 "$bench" train --threads 1 --steps 1 --data "$root/tests/data/fables.txt" | sed -E 's/.*; ([0-9.]+) MFLOP\/token.*/\1/')
for r in $(seq "$rounds"); do
  for t in 1 2; do
    a=$(OPENBLAS_NUM_THREADS=$t "$bench" train --threads "$t" --steps "$steps" --data "$root/tests/data/fables.txt")
    b=$(OMP_NUM_THREADS=$t "$py" "$root/bench/gpt_torch_throughput.py" --threads "$t" --steps "$steps" 2>/dev/null)
    echo "round $r: $a"
    echo "round $r: $b"
    sw[$t]+="$(tokens <<<"$a") "
    pt[$t]+="$(tokens <<<"$b") "
  done
done
echo
echo "model FLOPs per token (fwd + bwd matmuls: 6 x matmul params + 12 x layers x seq x hidden) = $flops M"
printf '%-8s %14s %14s %12s %12s %10s %10s\n' threads "shardwise t/s" "pytorch t/s" "shardwise/pt" "sgemm GF/s" "MFU sw" "MFU pt"
for t in 1 2; do
  s=$(tr ' ' '\n' <<<"${sw[$t]}" | grep . | median)
  p=$(tr ' ' '\n' <<<"${pt[$t]}" | grep . | median)
  awk -v t="$t" -v s="$s" -v p="$p" -v g="${sgemm[$t]}" -v f="$flops" 'BEGIN {
    printf "%-8s %14.0f %14.0f %12.2f %12.1f %9.1f%% %9.1f%%\n", t, s, p, s / p, g, 100 * s * f / (g * 1e3), 100 * p * f / (g * 1e3) }'
done
echo "   load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
