#pragma once
// A cluster description: the machines a plan predicts for (docs/planner.md). A small JSON file:
//
//   {"name": "...", "nodes": N, "devices_per_node": D,
//    "device": {"peak_flops": {"f32": F, "tf32": F, "bf16": F}, "memory_bytes": B, "memory_bandwidth": B/s},
//    "links": {"intra_node": {"bandwidth": B/s, "latency": s}, "inter_node": {...}},
//    "efficiency": {"compute": x, "memory": x, "network": x},   // optional, each in (0, 1], default 1
//    "sources": {"<key>": "where the number comes from", ...}}
//
// Bandwidths are per device and direction (what one device can send while receiving as much).
// `shardwise calibrate` writes this machine's description in the same format (plan/calibrate.h).
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace shardwise::plan {

struct LinkSpec {
  double bandwidth = 0;  // bytes/s per device and direction
  double latency = 0;    // seconds per message
};

// A measured GEMM rate (`shardwise calibrate`'s calibration.gemm): m x k by k x n in `dtype`.
struct GemmRate {
  std::string dtype;
  int64_t m = 0, n = 0, k = 0;
  double flops_per_s = 0;
};

// A calibration's fit of one instruction type ("layer_norm", "matmul_grad"; calibration.kernels):
// measured seconds of an instruction = overhead_s + scale x the model's own seconds of it (its GEMM
// FLOPs at the nearest shape's rate, or its bytes at the memory bandwidth), fitted over reference
// training runs (`shardwise calibrate`, cli/plan/kernel_calibrate.h).
struct KernelFit {
  double overhead_s = 0;  // fixed seconds an instruction (dispatch, allocation, thread wake-ups)
  double scale = 1;       // measured / modelled seconds of its work
};

// A calibration's measured collective of one kind (calibration.collectives.<kind>): seconds of a
// buffer of `bytes` a rank over `ranks` ranks of this machine, at a few sizes, smallest first.
struct MeasuredCollective {
  int ranks = 0;
  std::vector<std::pair<double, double>> points;  // (bytes, seconds)
};

struct ClusterSpec {
  std::string name;
  int64_t nodes = 1, devices_per_node = 1;
  std::map<std::string, double> peak_flops;  // "f32", "tf32", "bf16": FLOP/s per device
  double memory_bytes = 0, memory_bandwidth = 0;  // per device: bytes, bytes/s
  LinkSpec intra_node, inter_node;
  // Named efficiency factors (at most three: compute, memory, network); absent ones are 1.
  std::map<std::string, double> efficiency;
  nlohmann::json sources = nlohmann::json::object();  // key -> where its number comes from
  // A calibration's measured GEMM shapes (empty for a datasheet cluster): a GEMM is timed at the
  // rate of the nearest of its dtype (plan/cost.h gemm_seconds) instead of the peak.
  std::vector<GemmRate> gemm_rates;
  // A calibration's measured AdamW update (calibration.optimizer.elements_per_s; 0: none, the update
  // is then 7 f32 streams at the memory bandwidth).
  double optimizer_elements_per_s = 0;
  // A calibration's kernel fits by instruction type (empty: the model's seconds as they are).
  std::map<std::string, KernelFit> kernel_fits;
  // A calibration's slowdown of each instruction type when every core holds a rank (the kernels of
  // calibrate's two-rank references, measured over their fits; calibration.busy_kernel_scales): the
  // fits come from one rank on an otherwise idle machine, and memory-bound kernels and attention
  // lose most when both cores run ranks. Applied where a program's ranks are at least the cores.
  std::map<std::string, double> busy_kernel_scales;
  // A calibration's seconds a step outside the instructions and the optimizer (the trainer's own
  // work: the loader, the loss, zeroing gradients), the runtime's time between two instructions
  // (calibration.instruction_gap_s), and the cores the machine gives its ranks
  // (0: a datasheet cluster, each device its own; calibration.step_overhead_s, calibration.cores).
  double step_overhead_s = 0;
  double instruction_gap_s = 0;  // seconds a step between instructions, per instruction
  int64_t cores = 0;
  // A calibration's measured step of a mesh of n ranks on this machine over the model's (the fits
  // applied), by n (calibration.rank_factors; 2 and 4): what ranks sharing the cores, and waiting for
  // each other at every collective when the machine is busy, cost beyond the model's parts.
  std::map<int64_t, double> rank_factors;
  // The same by the reference's mesh ("[dp=2]", "[pp=2]", "[dp=2,tp=2]": ProcessMesh::to_string;
  // calibration.mesh_factors): a pipeline's or an expert mesh's ranks wait for each other otherwise
  // than a data-parallel pair.
  std::map<std::string, double> mesh_factors;
  // Whether a rank waiting in a collective holds its core (MPI processes: Open MPI polls), so that
  // ranks sharing the cores slow the collectives as they slow the kernels (for_backend sets it for
  // MPI). The threads backend waits on a condition variable and gives its core to a computing rank:
  // its collectives are not slowed by the contention (plan_predict.cc).
  bool waits_hold_cores = false;
  // A calibration's MPI collectives between processes of this machine (calibration.mpi.link: the
  // all-reduce's fit on `mpirun -np 2`; bandwidth 0: not measured).
  LinkSpec mpi_link;
  // A calibration's measured collectives by kind ("all_reduce", ...; calibration.collectives, and
  // calibration.mpi.collectives for MPI processes): a group of their ranks on one node is timed
  // between the measured sizes around its buffer instead of by the link's line (plan/cost.h
  // group_collective_seconds).
  std::map<std::string, MeasuredCollective> measured_collectives, mpi_collectives;

  int64_t devices() const { return nodes * devices_per_node; }
  double factor(const std::string& name) const;
  // The peak of `dtype` ("f32", "tf32", "bf16"); an Error naming the dtypes there are.
  double peak(const std::string& dtype) const;
};

inline constexpr const char* kPeakDtypes[] = {"f32", "tf32", "bf16"};
inline constexpr const char* kEfficiencyNames[] = {"compute", "memory", "network"};

// Parses a description; `where` (a file name) starts every error, which names the key at fault
// ("links.inter_node.bandwidth") and what it expected. Unknown keys are errors too (a typo would
// otherwise leave a default in place).
ClusterSpec parse_cluster(const nlohmann::json& j, const std::string& where);
ClusterSpec load_cluster(const std::string& path);

// The machine as a run of MPI processes meets it: with `mpi` and a measured mpi_link, both links
// are that link and the measured collectives MPI's (the ranks are processes of this machine), and
// with `mpi` its waits hold their cores; otherwise `c` as it is (the threads' links, or a cluster
// description's).
ClusterSpec for_backend(ClusterSpec c, bool mpi);
nlohmann::json cluster_json(const ClusterSpec& c);

}  // namespace shardwise::plan
