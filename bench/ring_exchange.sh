#!/usr/bin/env bash
# Ring attention's exchange against raw MPI_Sendrecv of the same bytes (issue 35), on 2 and 4 MPI
# processes: one ring step's k and v blocks (raw, shardwise blocking send/recv, shardwise started
# send/recv) and one forward ring_attention against its tiles alone (bench/bench_ring_mpi.cc).
#   bash bench/ring_exchange.sh [build] [seq ...]      (default: 4096 8192 16384; 4 heads of 64)
set -euo pipefail
build=${1:-build}
shift || true
seqs=${*:-4096 8192 16384}
echo "== ring exchange, $(nproc) cores, $(date -u '+%F %H:%M') UTC; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for np in 2 4; do
  # shellcheck disable=SC2086
  mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader --mca mpi_yield_when_idle 1 \
    -np "$np" "$build/bench/bench_ring_mpi" 4 64 $seqs
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
