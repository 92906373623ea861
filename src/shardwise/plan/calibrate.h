#pragma once
// `shardwise calibrate`'s measurements (docs/planner.md): this machine as a cluster description
// (plan/cluster.h), one device = one rank of the threads backend (one kernel thread), with what was
// measured under "calibration":
//   gemm:        [{dtype, m, n, k, seconds, flops_per_s}] a few training-step shapes, through the
//                tensor layer's GEMM (the backend --gemm chose); peak_flops.<dtype> is the best rate
//                (tf32 is f32 here: a CPU has no TF32)
//   memory:      {op: "add", elements, bytes, seconds, bytes_per_s} the op registry's add over large
//                tensors (2 read + 1 written): memory_bandwidth
//   collectives: {kind: {ranks, points: [[bytes, seconds] x 3], a, b, latency, bandwidth, note}} each
//                collective on `ranks` threads at three sizes (4 KB, 512 KB, 16 MB a rank), the line
//                t = a + b bytes through the smallest and largest inverted through the ring formula
//                (plan/cost.h); links.intra_node is all_reduce's fit, and links.inter_node the same
//                (one node: there is no other link here).
//   mpi:         (calibrate_mpi_collectives, under mpirun) {ranks, collectives: as above on MPI
//                processes, link: all_reduce's {bandwidth, latency}}: what MPI runs are predicted with.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace shardwise::comm {
class Communicator;
}

namespace shardwise::plan {

struct CalibrateOptions {
  bool quick = false;  // small shapes and messages, one repetition (for tests; seconds, not minutes)
  int ranks = 2;       // the threads the collectives run on (>= 2)
};

nlohmann::json calibrate_machine(const CalibrateOptions& options);

// The collectives on the processes of `world` (an MPI world of at least 2 processes; every rank
// calls it): {ranks, collectives, link} as calibration.mpi holds them, rank 0's measurements.
nlohmann::json calibrate_mpi_collectives(comm::Communicator& world, bool quick);

// A collective's measured seconds at increasing message sizes as a busy machine leaves them: ""
// when they look like one machine's collective (the smallest message within 1 ms, no message less
// than half the time of a smaller one), else a note saying which point is off and to calibrate
// again on a quiet machine (other ranks' work preempting the measured ranks: an MPI process that
// polls for 4 KiB on a loaded 2-core machine was measured at 48 ms, 2026-11-29).
std::string noisy_collective_note(const std::vector<double>& bytes, const std::vector<double>& seconds);

}  // namespace shardwise::plan
