#!/usr/bin/env bash
# PyTorch DTensor's per-op costs next to shardwise's rule calls, interleaved in one run.
# Usage: bash bench/dtensor_overhead.sh BUILD_DIR PYTHON [ROUNDS]
#   PYTHON: a python with torch 2.x (e.g. build/hf-venv/bin/python after `make hf-parity`).
set -euo pipefail
build=${1:?build dir}; python=${2:?python with torch}; rounds=${3:-3}
here=$(cd "$(dirname "$0")" && pwd)
for r in $(seq 1 "$rounds"); do
  echo "== round $r: PyTorch DTensor"
  "$python" "$here/dtensor_overhead.py" 2>/dev/null
  echo "== round $r: shardwise rule calls"
  "$build/bench/bench_rules" --benchmark_min_time=0.2 --benchmark_format=json \
    --benchmark_filter='rule/(unary gelu|binary add|reduction sum|matmul)' 2>/dev/null |
    python3 -c 'import json, sys
for b in json.load(sys.stdin)["benchmarks"]:
    print("%-52s %8.0f ns CPU" % (b["name"][5:], b["cpu_time"]))'
done
