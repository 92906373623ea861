#!/usr/bin/env bash
# The fused LM head + cross-entropy (--lm-head fused) against the unfused pair (logits [B*T, V] whole,
# then cross_entropy) at the GPT-2 small shape (124 M parameters, L12 d768 h12 T512 V50257 B4, 2
# threads), one build, interleaved unfused / fused / unfused / fused; and, given a second build
# from before the branch (MAIN_BUILD: unfused, gradients copied into their sums with one
# micro-batch), that build first in each round. Per run: tokens/s (first step excluded), the
# storage cache's peak bytes in use during a step and the process's max RSS. ~12 minutes here.
#
#   bash bench/lm_head_124m.sh BUILD [MAIN_BUILD] [STEPS]
B=${1:?build}; M=${2:-}; steps=${3:-3}
data="$(cd "$(dirname "$0")/.." && pwd)/tests/data/fables.txt"
cfg="--layers 12 --hidden 768 --heads 12 --seq 512 --vocab 50257 --batch 4 --threads 2 --steps $steps --data $data"
run() {  # label, binary, extra args
  out=$( { OPENBLAS_NUM_THREADS=2 /usr/bin/time -f "maxRSS %M KiB" "$2" train $cfg $3; } 2>&1 )
  echo "$1: $(echo "$out" | grep -o '[0-9]* tokens/s' | head -1) | $(echo "$out" | grep -o 'peak storage in use [0-9.]* MiB') | $(echo "$out" | tail -1)"
}
for round in 1 2; do
  [ -n "$M" ] && run "main (unfused, grad copy)" "$M/bench/bench_gpt" ""
  run "unfused" "$B/bench/bench_gpt" "--lm-head unfused"
  run "fused  " "$B/bench/bench_gpt" "--lm-head fused"
done
