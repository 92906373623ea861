#!/usr/bin/env bash
# Runs the collective benchmarks (issue 4): the mpi backend against raw MPI (mpirun -np 2, call
# checks on and off, interleaved in one run) and the local backend against memcpy.
#   bench/run_comm.sh [build] [mpi max bytes] [local max bytes]
set -euo pipefail
build=${1:-build}
mpi_max=${2:-268435456}
local_max=${3:-67108864}
echo "== mpi backend vs raw MPI ($(nproc) cores, $(date -u +%F))"
mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader -np 2 \
  "$build/bench/bench_comm_mpi" "$mpi_max"
echo
echo "== local backend vs memcpy"
"$build/bench/bench_comm_local" "$local_max"
