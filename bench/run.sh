#!/usr/bin/env bash
# Runs the rule benchmarks: ns per call (Google Benchmark) and instructions per call (callgrind).
set -euo pipefail
build=${1:-build}
echo "== ns per rule call ($(nproc) cores, $(date -u +%F))"
"$build/bench/bench_rules" --benchmark_min_time=0.2 --benchmark_format=console
echo
echo "== instructions per rule call (callgrind; (I(2N) - I(N)) / N with N = 20000)"
count() {
  local out; out=$(mktemp)
  valgrind --tool=callgrind --callgrind-out-file="$out" "$build/bench/rule_calls" "$1" "$2" >/dev/null 2>&1
  grep -E '^(summary|totals):' "$out" | head -1 | awk '{print $2}'
  rm -f "$out"
}
n=20000
while IFS=$'\t' read -r idx label; do
  a=$(count "$idx" "$n"); b=$(count "$idx" $((2 * n)))
  printf '%-50s %8d instructions/call\n' "$label" $(( (b - a) / n ))
done < <("$build/bench/rule_calls" --list)
echo
echo "== reshard plan time (auto strategy: both candidate plans built and costed)"
"$build/bench/bench_reshard" --benchmark_min_time=0.2 --benchmark_format=console
echo
echo "== completion of a 96-layer GPT (forward + backward) on [dp=2,tp=4]"
"$build/bench/bench_completion" --benchmark_format=console
