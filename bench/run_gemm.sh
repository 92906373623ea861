#!/usr/bin/env bash
# GEMM backends (issue 18, point 2): `shardwise gemm-check` (each backend checked against float64,
# then its step-mix SGEMM rate on the GPT-2 small step's GEMM shapes, 1 and 2 threads, three
# interleaved rounds), then the small config's training tokens/s with each backend, interleaved
# (each round runs every backend on 1 and 2 threads; the table gives the median over rounds and the
# ratio to `openblas`, OpenBLAS's own pick). The machine is shared: compare within one run only.
#
#   bash bench/run_gemm.sh [build] [rounds] [steps] [backends]
set -euo pipefail
build=${1:-build}
rounds=${2:-3}
steps=${3:-6}
backends=${4:-openblas openblas-haswell openblas-skylakex blis onednn}
root=$(cd "$(dirname "$0")/.." && pwd)
bench="$build/bench/bench_gpt"
sw="$build/bin/shardwise"
[[ -x $bench && -x $sw ]] || { echo "run_gemm.sh: build bench_gpt and shardwise first" >&2; exit 2; }
source "$(dirname "$0")/common.sh"  # median

echo "== GEMM backends on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) ($(nproc) cores, $(date -u '+%F %H:%M') UTC)"
echo "   OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-<unset>}; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
if [[ ${SKIP_CHECK:-0} != 1 ]]; then
  XDG_CACHE_HOME=$(mktemp -d) SHARDWISE_GEMM= "$sw" gemm-check --shape gpt2 --candidates "${backends// /,}"
fi
echo
declare -A tps
for r in $(seq "$rounds"); do
  for t in 1 2; do
    for b in $backends; do
      line=$(OPENBLAS_NUM_THREADS=$t OMP_NUM_THREADS=$t "$bench" train --gemm "$b" --threads "$t" --steps "$steps" \
             --data "$root/tests/data/fables.txt" | grep tokens/s)
      echo "round $r $b: $line"
      tps[$b,$t]+="$(sed -E 's/.*: ([0-9.]+) tokens\/s.*/\1/' <<<"$line") "
    done
  done
done
echo
echo "small config (L4 d256 h4 T256 V256 B8), tokens/s, median of $rounds rounds; ratio to openblas"
printf '%-20s %10s %8s %10s %8s\n' backend "1 thread" ratio "2 threads" ratio
for b in $backends; do
  row=$(printf '%-20s' "$b")
  for t in 1 2; do
    v=$(tr ' ' '\n' <<<"${tps[$b,$t]}" | grep . | median)
    base=$(tr ' ' '\n' <<<"${tps[openblas,$t]}" | grep . | median)
    row+=$(awk -v v="$v" -v b="$base" 'BEGIN { printf " %10.0f %8.2f", v, v / b }')
  done
  echo "$row"
done
echo "   load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
