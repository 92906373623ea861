#!/usr/bin/env bash
# Two builds' resharding load onto tp=4 side by side: the dp=2 x tp=2 checkpoint (1 GiB, 16 tensors
# "R,S(0)") loaded as S(1) on 4 rank threads with each build's defaults, after a buffered dd read of
# the same size; the page cache dropped before every read (root), the two builds' order alternating
# by round. Prints per round the dd read's GB/s and each load's GB/s, its ratio to that dd and the
# bytes read into the span cache (% of the checkpoint: over 100 = chunks read twice).
# Usage: bash bench/ab_ckpt_tp4.sh BUILD_A BUILD_B [dir on the disk to test] [rounds]
set -euo pipefail
a=$1/bench/bench_ckpt
b=$2/bench/bench_ckpt
dir=${3:-/tmp/shardwise_ab_tp4}
rounds=${4:-12}
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
rm -rf "$dir" && mkdir -p "$dir"
"$b" save "$dir/dptp" 1 4 dp2tp2 > /dev/null
dd if=/dev/zero of="$dir/dd.bin" bs=64M count=16 conv=fdatasync 2> /dev/null
sync; cat "$dir"/dptp/checkpoint-1/* "$dir/dd.bin" > /dev/null  # settle: see bench/ckpt.sh
echo "== $(date -u '+%F %H:%M') UTC, $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); A = $1, B = $2"
for r in $(seq 1 "$rounds"); do
  drop
  dd_gbs=$(dd if="$dir/dd.bin" of=/dev/null bs=64M 2>&1 | tail -1 | awk -F, '{print $NF}' |
           awk '{print $2 == "MB/s" ? $1 / 1000 : $1}')
  line="round $r: dd $dd_gbs GB/s"
  for w in $( ((r % 2)) && echo "A B" || echo "B A"); do
    bin=$a; [ "$w" = B ] && bin=$b
    drop
    read -r gbs pct < <("$bin" load "$dir/dptp/checkpoint-1" 4 |
                        sed 's/.*= \([0-9.]*\) GB\/s.*span cache[^:]*: \([0-9]*\)%.*/\1 \2/')
    line="$line | $w $gbs GB/s ($(awk -v x="$gbs" -v d="$dd_gbs" 'BEGIN {printf "%.2f", x / d}') dd, $pct% read)"
  done
  echo "$line"
done
rm -rf "$dir"
