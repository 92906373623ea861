#!/usr/bin/env bash
# Mixture of experts under MPI (issue 17), 4 processes:
#  1. bench_moe: the kernel's dispatch + combine (through node-shared memory, and by messages)
#     against raw MPI_Alltoallv of the same counts, and
#     moe_forward's grouped experts against a dense SwiGLU MLP of equal active FLOPs;
#  2. `shardwise train` tokens/s of a dense Llama and of an MoE Llama with the same active
#     parameters per token (8 experts, top-2, each expert half the dense MLP's width), rounds
#     interleaved (dense, MoE on dp=4, MoE on dp=2 x ep=2), the median over rounds.
#
#   bash bench/moe.sh [build] [rounds]
set -euo pipefail
build=${1:-build}
rounds=${2:-3}
root=$(cd "$(dirname "$0")/.." && pwd)
mpi="mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader -np 4"
source "$(dirname "$0")/common.sh"  # median
tokens() { sed -nE 's/^done: .*, ([0-9.]+) tokens\/s.*/\1/p'; }

echo "== MoE under mpirun -np 4 ($(nproc) cores, $(date -u +%F)); load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
OPENBLAS_NUM_THREADS=1 $mpi "$build/bench/bench_moe" 2048 256 512 8 2 20
echo
common="--model llama --layers 2 --hidden 256 --heads 4 --vocab 256 --seq 128 --global-batch 16 --steps 8 \
--eval-every 0 --progress none --data $root/tests/data/fables.txt --data-format bytes --run-dir ${TMPDIR:-/tmp}/shardwise_moe_bench"
declare -A tps
for r in $(seq "$rounds"); do
  for run in dense moe_dp4 moe_dp2_ep2; do
    case $run in
      dense) args="--intermediate-size 1024 --mesh dp=4" ;;
      moe_dp4) args="--intermediate-size 512 --experts 8 --top-k 2 --mesh dp=4" ;;
      moe_dp2_ep2) args="--intermediate-size 512 --experts 8 --top-k 2 --mesh dp=2,ep=2" ;;
    esac
    t=$(OPENBLAS_NUM_THREADS=1 $mpi "$build/bin/shardwise" train $common $args 2>&1 | tokens)
    echo "round $r: $run $t tokens/s"
    tps[$run]+="$t "
  done
done
d=$(tr ' ' '\n' <<<"${tps[dense]}" | grep . | median)
a=$(tr ' ' '\n' <<<"${tps[moe_dp4]}" | grep . | median)
b=$(tr ' ' '\n' <<<"${tps[moe_dp2_ep2]}" | grep . | median)
echo "median tokens/s: dense $d, MoE dp=4 $a ($(awk "BEGIN {printf \"%.2f\", $a / $d}")x), MoE dp=2 x ep=2 $b ($(awk "BEGIN {printf \"%.2f\", $b / $d}")x)"
