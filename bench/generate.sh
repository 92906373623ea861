#!/usr/bin/env bash
# Generation throughput (issue 14): `shardwise generate` with the KV cache against recomputing the
# whole prefix for every token (--no-kv-cache), side by side, interleaved, in one run.
#
#   bash bench/generate.sh [build] [rounds] [new tokens] [prompts]
#
# Model: bench/run_gpt.sh's configuration (layers 4, hidden 256, heads 4, seq 256, vocab 256),
# trained 2 steps on tests/data/fables.txt's bytes and saved (its weights do not change the cost). Prompts: the
# first non-empty lines of tests/data/fables.txt, cut to 32 bytes (the first is 28 bytes); greedy, no eos (every sequence generates every token).
# Meshes: one rank, and tp=2 on 2 threads. A run reports new tokens / (prefill + decode seconds);
# planning (once per graph shape: twice with the cache, once per length without) is reported apart.
# The table gives the median over rounds (the machine is shared: compare within one run only).
set -euo pipefail
build=${1:-build}
rounds=${2:-3}
new=${3:-200}
prompts=${4:-4}
bin="$build/bin/shardwise"
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
[[ -x $bin ]] || { echo "generate.sh: $bin is missing: cmake --build $build --target shardwise" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$bin" train --mesh dp=1 --layers 4 --hidden 256 --heads 4 --seq 256 --vocab 256 --data "$root/tests/data/fables.txt" \
  --global-batch 8 --steps 2 --eval-every 0 --save-every 2 --progress none --run-dir "$tmp/run" >/dev/null
ckpt="$tmp/run/checkpoints/checkpoint-2"
awk -v n="$prompts" 'NF && k < n { print substr($0, 1, 32); k++ }' "$root/tests/data/fables.txt" >"$tmp/prompts.txt"

source "$(dirname "$0")/common.sh"  # median
field() { python3 -c "import json, sys; print(json.loads(sys.stdin.readline())['stats']['$1'])"; }

echo "== shardwise generate: layers 4, hidden 256, heads 4, vocab 256; $prompts prompts of up to 32 tokens, $new new tokens each, greedy ($(nproc) cores, $(date -u +%F))"
echo "   load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A tps plan
for r in $(seq "$rounds"); do
  for mesh in dp=1 tp=2; do
    for mode in cache recompute; do
      flag=""; [[ $mode == recompute ]] && flag="--no-kv-cache"
      out=$(OPENBLAS_NUM_THREADS=1 "$bin" generate --checkpoint "$ckpt" --prompt-file "$tmp/prompts.txt" \
        --max-new-tokens "$new" --eos-id -1 --mesh "$mesh" --json $flag 2>/dev/null)
      t=$(field tokens_per_second <<<"$out")
      p=$(field plan_seconds <<<"$out")
      printf 'round %s: %-5s %-9s %8.1f tokens/s (planning %.3f s)\n' "$r" "$mesh" "$mode" "$t" "$p"
      tps[$mesh,$mode]+="$t
"
      plan[$mesh,$mode]+="$p
"
    done
  done
done
echo
echo "| mesh | KV cache tokens/s | recomputing tokens/s | speed-up | planning s (cache / recompute) |"
echo "|---|---:|---:|---:|---:|"
for mesh in dp=1 tp=2; do
  a=$(printf '%s' "${tps[$mesh,cache]}" | median)
  b=$(printf '%s' "${tps[$mesh,recompute]}" | median)
  pa=$(printf '%s' "${plan[$mesh,cache]}" | median)
  pb=$(printf '%s' "${plan[$mesh,recompute]}" | median)
  printf '| %s | %.0f | %.0f | %.1fx | %.2f / %.2f |\n' "$mesh" "$a" "$b" "$(python3 -c "print($a / $b)")" "$pa" "$pb"
done
