#!/usr/bin/env bash
# Checkpoint save/load throughput next to dd on the same disk, and the caller's blocking time of
# async vs sync saves. Usage: bash bench/ckpt.sh [build] [dir on the disk to test] [GiB]
set -euo pipefail
build=${1:-build}
dir=${2:-/tmp/shardwise_ckpt_bench}
gib=${3:-1}
rm -rf "$dir" && mkdir -p "$dir"
drop() { sync; if echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then echo "(page cache dropped)"; else echo "(page cache NOT dropped: reads may come from memory)"; fi; }
echo "== $(date -u +%F), $(nproc) cores, $gib GiB, dir $dir ($(df -h "$dir" | awk 'NR==2 {print $1}'))"
echo "-- dd write (bs=64M, conv=fdatasync)"
dd if=/dev/zero of="$dir/dd.bin" bs=64M count=$((gib * 16)) conv=fdatasync 2>&1 | tail -1
drop
echo "-- dd read"
dd if="$dir/dd.bin" of=/dev/null bs=64M 2>&1 | tail -1
rm -f "$dir/dd.bin"
for ranks in 1 2; do
  "$build/bench/bench_ckpt" save "$dir/r$ranks" "$gib" "$ranks"
  drop
  "$build/bench/bench_ckpt" load "$dir/r$ranks/checkpoint-1" "$ranks"
  rm -rf "$dir/r$ranks"
done
"$build/bench/bench_ckpt" async "$dir/async" "$gib"
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "-- torch.save / torch.load of the same tensors (Debian's python3-torch)"
  /usr/bin/python3 "$(dirname "$0")/ckpt_torch.py" save "$dir/torch" "$gib"
  drop
  /usr/bin/python3 "$(dirname "$0")/ckpt_torch.py" load "$dir/torch"
else
  echo "-- torch.save / torch.load: python3-torch is not installed (apt-get install python3-torch)"
fi
rm -rf "$dir"
