#!/usr/bin/env bash
# shardwise against PyTorch 2.x (eager with scaled_dot_product_attention, and torch.compile) on the
# same GPT training step (issue 18's targets), interleaved: for each config and thread count, each
# round runs shardwise (build/bench/bench_gpt), PyTorch eager sdpa and PyTorch compiled one after
# another; per run the tokens/s of the steps after the warm-up and the process's max RSS
# (/usr/bin/time). Also the best SGEMM rate on the same threads (bench_gpt sgemm) and shardwise's
# MFU = tokens/s x model FLOPs per token (bench_gpt's stated formula) / that rate.
#
#   bash bench/peer_torch2.sh BUILD [PYTHON] [ROUNDS] [CONFIGS] [THREADS]
#
# PYTHON: a Python with PyPI's torch 2.x; default bench/.venv-torch/bin/python, made on first use
# (python3 -m venv + pip install torch numpy; outside make test). CONFIGS: "small 124m" (default);
# small = L4 d256 h4 T256 V256 B8 (3.3 M), 124m = L12 d768 h12 T512 V50257 B4 (GPT-2 small shape).
# THREADS: "1 2" (default). A 124m round takes about 10 minutes on 2 idle cores.
set -euo pipefail
build=${1:?usage: peer_torch2.sh BUILD [PYTHON] [ROUNDS] [CONFIGS] [THREADS]}
root=$(cd "$(dirname "$0")/.." && pwd)
py=${2:-$root/bench/.venv-torch/bin/python}
rounds=${3:-2}
configs=${4:-small 124m}
threads=${5:-1 2}
if [[ ! -x $py ]]; then
  [[ $py == "$root/bench/.venv-torch/bin/python" ]] || { echo "peer_torch2.sh: no python at $py" >&2; exit 2; }
  python3 -m venv "$root/bench/.venv-torch" && "$root/bench/.venv-torch/bin/pip" install -q torch numpy
fi
bench="$build/bench/bench_gpt"
[[ -x $bench ]] || { echo "peer_torch2.sh: $bench is missing: cmake --build $build --target bench_gpt" >&2; exit 2; }
data="$root/tests/data/fables.txt"

shape() {
  case $1 in
    small) echo "--layers 4 --hidden 256 --heads 4 --seq 256 --vocab 256 --batch 8" ;;
    124m) echo "--layers 12 --hidden 768 --heads 12 --seq 512 --vocab 50257 --batch 4" ;;
    *) echo "peer_torch2.sh: unknown config $1 (small, 124m)" >&2; exit 2 ;;
  esac
}
steps_of() { [[ $1 == small ]] && echo 8 || echo 4; }
# "<tokens/s> <max RSS MiB>" of one run: label, then the command.
measure() {
  local out
  out=$( { /usr/bin/time -f "maxRSS %M" "$@"; } 2>&1 )
  local tps rss
  tps=$(grep -o '[0-9.]* tokens/s' <<<"$out" | head -1 | cut -d' ' -f1)
  rss=$(grep -o 'maxRSS [0-9]*' <<<"$out" | tail -1 | awk '{printf "%.0f", $2 / 1024}')
  echo "${tps:-nan} ${rss:-nan}"
}

echo "== shardwise vs PyTorch $("$py" -c 'import torch; print(torch.__version__)') ($(nproc) cores, $(date -u '+%F %H:%M UTC'))"
echo "   load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A sgemm
for t in $threads; do
  line=$(OPENBLAS_NUM_THREADS=$t "$bench" sgemm --threads "$t" | grep 'GFLOP/s')
  echo "   $line"
  sgemm[$t]=$(sed -E 's/.*: ([0-9.]+) GFLOP\/s.*/\1/' <<<"$line")
done
results=()
for cfg in $configs; do
  s=$(shape "$cfg"); k=$(steps_of "$cfg")
  flops=$(OPENBLAS_NUM_THREADS=1 "$bench" train --threads 1 --steps 1 $s --data "$data" | grep 'MFLOP/token' | sed -E 's/.*; ([0-9.]+) MFLOP\/token.*/\1/')
  for r in $(seq "$rounds"); do
    for t in $threads; do
      a=$(OPENBLAS_NUM_THREADS=$t measure "$bench" train --threads "$t" --steps "$k" $s --data "$data")
      b=$(OMP_NUM_THREADS=$t measure "$py" "$root/bench/gpt_torch_throughput.py" --threads "$t" --steps "$k" $s --attention sdpa)
      c=$(OMP_NUM_THREADS=$t measure "$py" "$root/bench/gpt_torch_throughput.py" --threads "$t" --steps $((k + 1)) --warmup 2 \
            $s --attention sdpa --compile)
      echo "round $r $cfg threads $t: shardwise $a | eager sdpa $b | compiled $c (tokens/s, max RSS MiB)"
      results+=("$cfg $t $a $b $c $flops")
    done
  done
done
echo
echo "per run: tokens/s ratio to the faster PyTorch, max RSS ratio to that run's, MFU = tokens/s x MFLOP/token / SGEMM rate"
printf '%-6s %-3s %10s %10s %10s %14s %12s %8s\n' config thr shardwise eager compiled "sw/best peer" "RSS sw/peer" MFU
for line in "${results[@]}"; do
  read -r cfg t sa sr ba br ca cr f <<<"$line"
  awk -v c="$cfg" -v t="$t" -v sa="$sa" -v sr="$sr" -v ba="$ba" -v br="$br" -v ca="$ca" -v cr="$cr" -v f="$f" -v g="${sgemm[$t]}" 'BEGIN {
    best = ba > ca ? ba : ca; bestr = ba > ca ? br : cr
    printf "%-6s %-3s %10.0f %10.0f %10.0f %14.2f %12.2f %7.1f%%\n", c, t, sa, ba, ca, sa / best, sr / bestr, 100 * sa * f / (g * 1e3) }'
done
echo "   load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
