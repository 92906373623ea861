#!/usr/bin/env bash
# Two builds' bench_gpt training side by side in ABBA order (A B B A per pair: a drift of the shared
# machine's load hits both sides alike), with the load average before each run:
#
#   bash bench/abba_gpt.sh /work/main/build build [pairs] [threads] [steps] [-- extra bench_gpt options]
#
# e.g. `... build 4 2 8` (the small config on 2 threads) or `... build 1 2 3 -- --layers 12
# --hidden 768 --heads 12 --seq 512 --vocab 50257 --batch 4` (the 124 M shape). Prints every run,
# then the B / A ratio of each pair's sums and the median tokens/s of each side.
set -euo pipefail
a=${1:?build A}
b=${2:?build B}
pairs=${3:-4}
threads=${4:-2}
steps=${5:-8}
shift $(( $# < 5 ? $# : 5 ))
[[ ${1:-} == -- ]] && shift
extra=("$@")
here=$(cd "$(dirname "$0")" && pwd)
data="$here/../tests/data/fables.txt"
for d in "$a" "$b"; do
  [[ -x $d/bench/bench_gpt ]] || { echo "abba_gpt.sh: $d/bench/bench_gpt is missing" >&2; exit 2; }
done
source "$here/common.sh"  # median
med() { printf "%s\n" "$@" | median; }
echo "== A $a vs B $b: $(nproc) cores, $(date -u '+%F %H:%M') UTC, $pairs ABBA pairs, $threads threads, $steps steps ${extra[*]}"
as=() bs=() ratios=()
for p in $(seq "$pairs"); do
  declare -A sum=([A]=0 [B]=0)
  for side in A B B A; do
    d=$a; [[ $side == B ]] && d=$b
    load=$(cut -d' ' -f1 /proc/loadavg)
    tps=$("$d/bench/bench_gpt" train --threads "$threads" --steps "$steps" --data "$data" "${extra[@]}" |
          sed -nE 's/.*: ([0-9.]+) tokens\/s.*/\1/p')
    echo "pair $p $side: $tps tokens/s (load $load)"
    sum[$side]=$(python3 -c "print(${sum[$side]} + $tps)")
    if [[ $side == A ]]; then as+=("$tps"); else bs+=("$tps"); fi
  done
  r=$(python3 -c "print(f'{${sum[B]} / ${sum[A]}:.3f}')")
  ratios+=("$r")
  echo "pair $p: B / A $r"
done
echo "B / A per pair: ${ratios[*]}; median tokens/s A $(med "${as[@]}"), B $(med "${bs[@]}"); load now $(cut -d' ' -f1-3 /proc/loadavg)"
