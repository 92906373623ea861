#!/usr/bin/env bash
# Checkpoint save/load throughput next to dd on the same disk, interleaved round by round (the
# machine is shared: compare within a round), and the caller's blocking time of async vs sync
# saves. Loads: a checkpoint saved on 1 rank (S(0)) and one saved on dp=2 x tp=2 ("R,S(0)"), loaded
# as S(1) on 1 rank and on tp=4 (with and without the span cache); O_DIRECT with 2/4/8 requests in flight or the page cache with
# 1/2 reader threads, huge-page destinations on/off; and the
# peers' loads of the same bytes: safetensors' safe_open on shardwise's own files, torch.load of a
# torch.save of the same tensors (both when $PYTHON imports them: a venv, see BENCHMARKS.md).
# Saves: the default (O_DIRECT, ckpt::SaveTuning), O_DIRECT with other requests in flight / piece
# sizes, and the page cache, each next to dd's buffered write + fdatasync and dd oflag=direct.
# Usage: [PYTHON=venv/bin/python] [PARTS=save|load|save,load] [LOADS=all|short] bash bench/ckpt.sh [build] [dir on the disk to test] [GiB] [rounds]
set -euo pipefail
build=${1:-build}
dir=${2:-/tmp/shardwise_ckpt_bench}
gib=${3:-1}
rounds=${4:-3}
py=${PYTHON:-python3}
parts=${PARTS:-save,load}
which_loads=${LOADS:-all}
here=$(dirname "$0")
bench="$build/bench/bench_ckpt"
rm -rf "$dir" && mkdir -p "$dir"
drop() { sync; if ! echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then echo "(page cache NOT dropped: reads may come from memory)"; fi; }
echo "== $(date -u +%F), $(nproc) cores, $gib GiB, dir $dir ($(df -h "$dir" | awk 'NR==2 {print $1}')), THP $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
drop_ok=$( (echo 3 > /proc/sys/vm/drop_caches) 2>/dev/null && echo yes || echo no)
echo "page cache dropped before every read: $drop_ok"
has_st=$($py -c "import safetensors" 2>/dev/null && echo yes || echo no)
has_torch=$($py -c "import torch" 2>/dev/null && echo yes || echo no)
echo "peers ($py): safetensors $has_st, torch $has_torch"
for r in $(seq 1 "$rounds"); do
  echo "-- round $r: saves"
  echo -n "dd write (bs=64M, conv=fdatasync): "
  dd if=/dev/zero of="$dir/dd.bin" bs=64M count=$((gib * 16)) conv=fdatasync 2>&1 | tail -1
  echo -n "dd write (bs=64M, oflag=direct): "
  dd if=/dev/zero of="$dir/dd.bin" bs=64M count=$((gib * 16)) oflag=direct conv=fdatasync 2>&1 | tail -1
  # save ARGS after DIR GIB RANKS: LAYOUT DIRECT PIECE_MIB (DIRECT 0: the page cache). The order
  # rotates by round; the default's files are the ones loaded below.
  if [[ $parts == *save* ]]; then
    saves=("tp 4 16" "tp 0 16" "tp 2 64" "tp 8 8")
    for i in "${!saves[@]}"; do
      cfg=${saves[$(( (i + r - 1) % ${#saves[@]} ))]}
      rm -rf "$dir/s"; sync; "$bench" save "$dir/s" "$gib" 1 $cfg
    done
    rm -rf "$dir/s"
  fi
  rm -rf "$dir/r1" "$dir/dptp"
  "$bench" save "$dir/r1" "$gib" 1
  "$bench" save "$dir/dptp" "$gib" 4 dp2tp2
  if [ "$has_torch" = yes ]; then rm -rf "$dir/torch"; $py "$here/ckpt_torch.py" save "$dir/torch" "$gib"; fi
  [[ $parts == *load* ]] || continue
  echo "-- round $r: loads (page cache dropped before each)"
  # Settle: the first read of files just saved is slower on this VM's disk (the host still writing
  # them back?), whichever load comes first: read them once, untimed.
  sync; cat "$dir"/r1/checkpoint-1/* "$dir"/dptp/checkpoint-1/* "$dir"/dd.bin > /dev/null
  drop; echo -n "dd read (bs=64M): "; dd if="$dir/dd.bin" of=/dev/null bs=64M 2>&1 | tail -1
  # load ARGS: RANKS READERS HUGE_PAGES WILLNEED DIRECT [SPAN_CACHE_MIB] (the defaults: O_DIRECT
  # with 8 requests in flight for whole tensors and row blocks; column blocks of ranks sharing a
  # process through the 64 MiB span cache; 2 buffered readers, 4 KiB pages, WILLNEED otherwise;
  # huge pages were the default until 2026-11-29, one load still measures them).
  # One list of every load, peers included, its order rotated by round, so no load is always first
  # or last. LOADS=short keeps the default loads, the tp=4 page-cache one and the peers.
  loads=("r1 1 2 0 1 8" "dptp 4 2 0 1 8" "dptp 4 1 0 1 8 0" "st" "torch" "dptp 1 2 0 1 8")
  if [ "$which_loads" != short ]; then
    loads+=("r1 1 2 0 1 4" "r1 1 2 0 1 2" "r1 1 2 1 1 8" "r1 1 2 0 1 0" "r1 1 1 0 1 0" "dptp 4 2 0 1 8 0")
  fi
  for i in "${!loads[@]}"; do
    set -- ${loads[$(( (i + r - 1) % ${#loads[@]} ))]}
    case $1 in
      st) if [ "$has_st" = yes ]; then drop; echo -n "[1-rank ckpt] "; $py "$here/ckpt_safetensors.py" "$dir/r1/checkpoint-1"; fi ;;
      torch) if [ "$has_torch" = yes ]; then drop; $py "$here/ckpt_torch.py" load "$dir/torch"; fi ;;
      r1) shift; drop; echo -n "[1-rank ckpt] "; "$bench" load "$dir/r1/checkpoint-1" "$@" ;;
      dptp) shift; drop; echo -n "[dp2tp2 ckpt] "; "$bench" load "$dir/dptp/checkpoint-1" "$@" ;;
    esac
  done
  drop; echo -n "dd read (bs=64M): "; dd if="$dir/dd.bin" of=/dev/null bs=64M 2>&1 | tail -1
  # Last: a load right after an O_DIRECT dd measured slower on this VM's disk.
  drop; echo -n "dd read (bs=64M, iflag=direct): "; dd if="$dir/dd.bin" of=/dev/null bs=64M iflag=direct 2>&1 | tail -1
done
"$bench" async "$dir/async" "$gib"
rm -rf "$dir"
