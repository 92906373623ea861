#!/usr/bin/env bash
# Sharding stages on an MoE Llama on dp=2 x ep=2 (issue 17): rank 0's optimizer bytes, parameter
# bytes and peak from `shardwise plan --memory --json` of two builds side by side (e.g. before and
# after sharding the dense state over dp x ep), on bench/moe.sh's model (vocab 256: experts dominate)
# and the same with vocab 16384 (a bigger dense share: the embedding and the head).
#
#   bash bench/moe_sharding_memory.sh BEFORE_BIN AFTER_BIN
set -euo pipefail
before=$1
after=$2
echo "== plan --memory, MoE Llama on dp=2 x ep=2, rank 0 ($(date -u +%F))"
for vocab in 256 16384; do
  M="--model llama --layers 2 --hidden 256 --heads 4 --vocab $vocab --seq 128 --global-batch 16 --intermediate-size 512
     --experts 8 --top-k 2 --mesh dp=2,ep=2 --sharding-layout v2"
  for s in 0 1 2 3; do
    # shellcheck disable=SC2086
    { "$before" plan --memory --json $M --sharding-stage "$s"; "$after" plan --memory --json $M --sharding-stage "$s"; } |
      python3 -c "
import json, sys
d = json.JSONDecoder(); t = sys.stdin.read(); a, i = d.raw_decode(t); b, _ = d.raw_decode(t[i:].lstrip())
A, B, M = a['ranks'][0], b['ranks'][0], 2 ** 20
print(f'vocab $vocab stage $s: optimizer {A[\"optimizer\"] / M:.2f} -> {B[\"optimizer\"] / M:.2f} MiB '
      f'({B[\"optimizer\"] / A[\"optimizer\"]:.2f}x), params {A[\"params\"] / M:.2f} -> {B[\"params\"] / M:.2f} MiB, '
      f'peak {A[\"peak\"] / M:.2f} -> {B[\"peak\"] / M:.2f} MiB ({B[\"peak\"] / A[\"peak\"]:.2f}x)')"
  done
done
