#!/usr/bin/env bash
# Two builds side by side, interleaved in one run (this machine is shared: only ratios within one
# run mean anything): SPMD rule cost (bench_rules, ns per call) and GPT training throughput
# (bench_gpt, tokens/s on 1 and 2 threads). For a change that must not cost speed, e.g. a build of
# the merge base beside the working tree:
#
#   git worktree add /tmp/base <rev> && cmake -S /tmp/base -B /tmp/base/build -G Ninja && cmake --build /tmp/base/build
#   bash bench/compare_builds.sh /tmp/base/build build [rounds] [steps]
#
# Each round runs A then B (rules, then GPT on 1 and 2 threads); the tables give medians over rounds
# (rule cost: CPU time per call).
set -euo pipefail
a=${1:?build A}
b=${2:?build B}
rounds=${3:-3}
steps=${4:-6}
here=$(cd "$(dirname "$0")" && pwd)
data="$here/../tests/data/fables.txt"
for d in "$a" "$b"; do
  for p in bench_rules bench_gpt; do
    [[ -x $d/bench/$p ]] || { echo "compare_builds.sh: $d/bench/$p is missing" >&2; exit 2; }
  done
done
source "$(dirname "$0")/common.sh"  # median
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "== $a (A) vs $b (B): $(nproc) cores, $(date -u +%F), load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$rounds"); do
  for side in A B; do
    d=$a; [[ $side == B ]] && d=$b
    "$d/bench/bench_rules" --benchmark_format=json --benchmark_min_time=0.05 2>/dev/null |
      python3 -c 'import json, sys
for b in json.load(sys.stdin)["benchmarks"]:
    print(b["name"] + "\t" + str(b["cpu_time"]))' >> "$tmp/rules_$side"
    for t in 1 2; do
      OPENBLAS_NUM_THREADS=$t "$d/bench/bench_gpt" train --threads "$t" --steps "$steps" --data "$data" |
        sed -E 's/.*: ([0-9.]+) tokens\/s.*/\1/' >> "$tmp/gpt_${side}_$t"
    done
  done
done
echo
echo "| rule call | A ns | B ns | B / A |"
echo "|---|---|---|---|"
cut -f1 "$tmp/rules_A" | sort -u | while IFS= read -r name; do
  na=$(awk -F'\t' -v n="$name" '$1 == n {print $2}' "$tmp/rules_A" | median)
  nb=$(awk -F'\t' -v n="$name" '$1 == n {print $2}' "$tmp/rules_B" | median)
  [[ -n $nb ]] || continue
  awk -v n="${name#rule/}" -v x="$na" -v y="$nb" 'BEGIN {printf "| %s | %.0f | %.0f | %.2f |\n", n, x, y, y / x}'
done
echo
echo "| GPT training (L4 d256 h4 T256 V256 B8) | A tokens/s | B tokens/s | B / A |"
echo "|---|---|---|---|"
for t in 1 2; do
  ga=$(median < "$tmp/gpt_A_$t"); gb=$(median < "$tmp/gpt_B_$t")
  awk -v t="$t" -v r="$rounds" -v x="$ga" -v y="$gb" \
    'BEGIN {printf "| %d thread(s), median of %d | %.0f | %.0f | %.3f |\n", t, r, x, y, y / x}'
done
