#!/usr/bin/env bash
# ep as a data dim (issue 17, Megatron's expert-data-parallel) against the former layout, two
# builds side by side: A (e.g. the merge base, where the batch is split over dp only and the ep
# ranks run the dense layers alike) and B (the batch split over dp x ep). The MoE Llama of
# bench/moe.sh on dp=2 x ep=2, 4 MPI processes, the same global batch on both:
#  1. `shardwise plan --memory`: each build's largest rank (activations and working buffers) and
#     its MoE traffic lines;
#  2. `shardwise train` tokens/s (the `done:` line, first step included), rounds interleaved A, B;
#     the median over rounds.
#
#   git worktree add /tmp/base <rev> && cmake -S /tmp/base -B /tmp/base/build -G Ninja && cmake --build /tmp/base/build
#   bash bench/ep_data.sh /tmp/base/build build [rounds] [steps]
set -euo pipefail
a=${1:?build A}
b=${2:?build B}
rounds=${3:-3}
steps=${4:-8}
root=$(cd "$(dirname "$0")/.." && pwd)
mpi="mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader -np 4"
source "$(dirname "$0")/common.sh"  # median
tokens() { sed -nE 's/^done: .*, ([0-9.]+) tokens\/s.*/\1/p'; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
model="--model llama --layers 2 --hidden 256 --heads 4 --vocab 256 --seq 128 --intermediate-size 512 --experts 8 \
--top-k 2 --mesh dp=2,ep=2 --global-batch 16"
echo "== ep as a data dim: $a (A) vs $b (B), $(nproc) cores, $(date -u '+%F %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
for side in A B; do
  d=$a; [[ $side == B ]] && d=$b
  echo "-- $side: shardwise plan --memory $model"
  "$d/bin/shardwise" plan --memory $model --data "$root/tests/data/fables.txt" --data-format bytes |
    grep -vE "^ +[1-9][0-9]* |memory-limit" || true  # rank 0 stands for the others
done
declare -A tps
for r in $(seq "$rounds"); do
  for side in A B; do
    d=$a; [[ $side == B ]] && d=$b
    rm -rf "$tmp/run"
    out=$(OPENBLAS_NUM_THREADS=1 nice $mpi "$d/bin/shardwise" train $model --steps "$steps" --eval-every 0 \
          --progress none --data "$root/tests/data/fables.txt" --data-format bytes --run-dir "$tmp/run" 2>&1)
    t=$(echo "$out" | tokens)
    echo "round $r $side: ${t:-failed} tokens/s"
    tps[$side]+="${t:-0} "
  done
done
ma=$(echo "${tps[A]}" | tr ' ' '\n' | grep . | median)
mb=$(echo "${tps[B]}" | tr ' ' '\n' | grep . | median)
echo "median tokens/s: A $ma, B $mb, B / A $(awk -v a="$ma" -v b="$mb" 'BEGIN {printf "%.2f", b / a}')"
