#!/usr/bin/env bash
# Long context (issue 35): one rank, tp=2, cp=2 with ring attention and cp=2 with the all-gather
# exchange, side by side in one run, at two sequence lengths: a Llama of 2 layers, hidden 256,
# 4 heads, one sequence a step (global batch 1), the threads backend (one kernel thread a rank).
# For each: the median tokens/s of steps 2.. (metrics.jsonl's tokens_per_s; step 1 warms up) and the
# process's peak RSS (every rank is a thread of it), against the memory plan's bytes for the process
# and its activations per rank.
#
# With CP_BENCH_LAUNCH=mpi the 2-rank runs are 2 MPI processes (mpirun -np 2) instead of threads:
# peak RSS is then the largest process's (each holds one rank).
#
#   bash bench/cp_long_context.sh [build] [seq ...]      (default: 4096 8192)
#   CP_BENCH_LAUNCH=mpi bash bench/cp_long_context.sh [build] [seq ...]
set -euo pipefail
build=${1:-build}
shift || true
seqs=${*:-4096 8192}
root=$(cd "$(dirname "$0")/.." && pwd)
source "$(dirname "$0")/common.sh"  # median
work=${TMPDIR:-/tmp}/shardwise_cp_bench
rm -rf "$work" && mkdir -p "$work"
model="--model llama --layers 2 --hidden 256 --heads 4 --vocab 256 --global-batch 1 --micro-batch 1"
launch=${CP_BENCH_LAUNCH:-threads}
case $launch in
  threads) mpirun=() ;;
  mpi) mpirun=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader --mca mpi_yield_when_idle 1 -np 2) ;;
  *) echo "CP_BENCH_LAUNCH must be threads or mpi, not '$launch'" >&2; exit 2 ;;
esac
echo "== context parallelism ($launch), $(nproc) cores, $(date -u '+%F %H:%M') UTC; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-6s %-12s %10s %14s %18s %26s\n' seq run tokens/s "peak RSS MiB" "plan process MiB" "plan activations/rank MiB"
for seq in $seqs; do
  for run in one_rank tp2 cp2_ring cp2_gather; do
    case $run in
      one_rank) mesh="dp=1" ;;
      tp2) mesh="tp=2" ;;
      cp2_ring) mesh="cp=2 --cp-attention ring" ;;
      cp2_gather) mesh="cp=2 --cp-attention gather" ;;
    esac
    dir="$work/$run-$seq"
    # shellcheck disable=SC2086
    launcher=()
    [ "$run" != one_rank ] && launcher=("${mpirun[@]}")
    /usr/bin/time -f '%M' -o "$dir.rss" ${launcher[@]+"${launcher[@]}"} "$build/bin/shardwise" train $model --seq "$seq" --mesh $mesh --steps 4 \
      --eval-every 0 --progress none --memory-limit none --data "$root/tests/data/fables.txt" --data-format bytes \
      --run-dir "$dir" >/dev/null
    tps=$(tail -n +2 "$dir/metrics.jsonl" | sed -nE 's/.*"tokens_per_s":([0-9.e+-]+).*/\1/p' | median)
    rss=$(awk '{printf "%.0f", $1 / 1024}' "$dir.rss")
    # shellcheck disable=SC2086
    act=$("$build/bin/shardwise" plan $model --seq "$seq" --mesh $mesh --memory --json 2>/dev/null |
      python3 -c 'import json,sys; j=json.load(sys.stdin); print(round(j["per_process"]/2**20), round(j["ranks"][0]["activations"]/2**20, 1))' \
      2>/dev/null || echo "? ?")
    printf '%-6s %-12s %10.0f %14s %18s %26s\n' "$seq" "$run" "$tps" "$rss" ${act}
  done
done
