#!/usr/bin/env bash
# Sharding stage 2 with the gradient reduce-scatter after the backward (off: one per parameter;
# after: in buckets) and during it (on: each gradient's buffer freed once handed to its bucket):
# the process's peak RSS (/usr/bin/time -v) and the memory plan's figures (rank 0's grads, working
# and peak, and the process's: every rank as threads), dp=4 as threads of one process, one
# micro-batch of one sequence per rank, a GPT-2 of 14.7 M parameters (hidden 512, 4 layers, vocab
# 4096, seq 64) whose gradients outweigh its activations, 3 steps; one run at a time, ROUNDS
# interleaved rounds.
#
#   bash bench/grad_overlap_memory.sh [BUILD_DIR=build] [ROUNDS=2]
set -euo pipefail
B=${1:-build}; ROUNDS=${2:-2}
cfg="--mesh dp=4 --layers 4 --hidden 512 --heads 8 --seq 64 --vocab 4096 --global-batch 4 --accumulation 1 --steps 3
     --eval-every 0 --warmup 1 --progress none --sharding-stage 2 --sharding-layout v2 --grad-bucket-mb 4"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mib='{:.1f}'
for round in $(seq "$ROUNDS"); do
  for mode in off after on; do
    rm -rf "$dir/run"
    plan=$("$B/bin/shardwise" train $cfg --overlap-grad-reduce "$mode" --dry-run --json |
           python3 -c "import json,sys; p=json.load(sys.stdin); r=p['ranks'][0]; m=lambda b: '$mib'.format(b/2**20)
print(f\"plan rank 0: grads {m(r['grads'])} working {m(r['working'])} peak {m(r['peak'])} MiB; process {m(p['per_process'])} MiB\")")
    out=$( { OPENBLAS_NUM_THREADS=1 nice /usr/bin/time -v "$B/bin/shardwise" train $cfg --overlap-grad-reduce "$mode" \
             --run-dir "$dir/run"; } 2>&1 )
    rss=$(echo "$out" | grep 'Maximum resident' | grep -o '[0-9]*$')
    echo "round $round overlap $mode: peak_rss_kib=$rss; $plan"
  done
done
