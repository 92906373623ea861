#pragma once
// The step-time model's pieces (docs/planner.md): the time of a GEMM, of a memory-bound kernel and
// of each collective on the links its group's ranks sit on, and the alpha-beta fit that calibrate
// derives a link from.
#include <map>
#include <span>
#include <tuple>
#include <string>

#include "shardwise/pipeline/schedule.h"
#include "shardwise/plan/cluster.h"

namespace shardwise::plan {

enum class CollectiveKind { AllReduce, AllGather, ReduceScatter, AllToAll, SendRecv };
std::string collective_name(CollectiveKind kind);  // "all_reduce", ...

// The dtype whose rate a GEMM runs at: bf16 for bf16 operands (bf16 compute), else f32 whatever
// the parameters' dtype `dtype` (which names the f32-class peak, "f32" or "tf32", unless it is bf16).
std::string gemm_rate_dtype(bool bf16_operands, const std::string& dtype);
// Seconds of `flops` FLOPs in `dtype` at the device's peak times the compute efficiency.
double compute_seconds(const ClusterSpec& c, double flops, const std::string& dtype);
// Seconds of a GEMM-like kernel of `flops` whose product is m x k by k x n: at the rate of the
// measured shape of its dtype (tf32: f32's) nearest in log m, log n and log k when the cluster has
// measured ones (a calibration), else at the peak; times the compute efficiency.
double gemm_seconds(const ClusterSpec& c, double flops, const std::string& dtype, int64_t m, int64_t n, int64_t k);
// Seconds to read and write `bytes` at the device's memory bandwidth times the memory efficiency.
double memory_seconds(const ClusterSpec& c, double bytes);

// A kernel of `type` ("layer_norm_grad") the model times at `modelled` seconds: overhead_s + scale x
// modelled by the cluster's fit of that type (a calibration's), else `modelled`.
double fitted_seconds(const ClusterSpec& c, const std::string& type, double modelled);

// One reference run's instructions of a type: how many ran a step, the model's seconds of them
// (unfitted) and the measured seconds.
struct KernelSample {
  double count = 0, modelled = 0, measured = 0;
};
// The least-squares fit of measured = count x overhead_s + scale x modelled over the samples, both
// terms >= 0 (one clamped to 0, the other refitted alone); Error without a sample that ran.
KernelFit fit_kernel(std::span<const KernelSample> samples);

// How much slower a kernel runs when `threads` kernel threads (ranks x threads a rank) share the
// machine's cores: threads / cores when they exceed them, else 1 (a datasheet cluster, cores 0: 1).
double core_contention(const ClusterSpec& c, int64_t threads);
// How much slower than the model's parts a step of `ranks` ranks (one kernel thread each) runs: the
// calibration's measured factor for that many ranks where it has one, else core_contention.
double rank_factor(const ClusterSpec& c, int64_t ranks);
// The same for a mesh (`mesh`: ProcessMesh::to_string, "[pp=2]"): the calibration's factor measured
// on that mesh where it has one, else rank_factor of its size.
double mesh_factor(const ClusterSpec& c, const std::string& mesh, int64_t ranks);

// The link a group's collective runs over: intra-node when all its ranks (global ranks, placed
// devices_per_node to a node in rank order) share a node, else inter-node (the slower link
// bounds a ring that crosses nodes); bandwidth times the network efficiency.
LinkSpec group_link(const ClusterSpec& c, std::span<const int> ranks);

// Ring algorithms over `ranks` members (Thakur et al. 2005; NCCL's ring): `bytes` is each rank's
// whole buffer (the all-reduced buffer, the gathered output, the scattered input, the all-to-all
// send buffer, or the message).
//   all_reduce:                         2 (p-1) latency + 2 (p-1)/p bytes / bandwidth
//   all_gather, reduce_scatter, all_to_all: (p-1) latency +   (p-1)/p bytes / bandwidth
//   send_recv:                              latency + bytes / bandwidth
// A group of one rank costs nothing.
double collective_seconds(CollectiveKind kind, double bytes, int ranks, const LinkSpec& link);

// A collective of `kind` over `group` (global ranks) with a buffer of `bytes` a rank (as
// collective_seconds): where the cluster measured that kind over as many ranks (a calibration,
// MeasuredCollective) and the group sits on one node, the line between the two measured sizes
// around `bytes` (beyond the smallest or the largest, the nearest two's line, at least 0): a
// calibration measures 4 KB, 512 KB and 16 MB, and a mid-sized buffer (a tensor-parallel
// all-reduce) runs far off the line through the ends (in cache, 2026-11-29: 65 us at 512 KB where
// that line said 242); otherwise collective_seconds on the group's link.
double group_collective_seconds(const ClusterSpec& c, CollectiveKind kind, double bytes, std::span<const int> group);
// The bandwidth share of a ring collective: the bytes the busiest rank sends over its buffer's
// (all_reduce 2 (p-1)/p, send_recv 1, the others (p-1)/p).
double ring_share(CollectiveKind kind, int ranks);

// t = a + b n through two measured points (n1, t1), (n2, t2) with n1 != n2, and the link of a
// ring collective of `kind` over `ranks` that gives it (inverting collective_seconds): b <= 0
// (the larger message was not slower) or a < 0 is clamped (bandwidth infinite / latency 0) and said
// in `note`.
struct AlphaBeta {
  double a = 0, b = 0;  // seconds, seconds per byte
  LinkSpec link;
  std::string note;
  double predict(double bytes) const { return a + b * bytes; }
};
AlphaBeta fit_alpha_beta(CollectiveKind kind, int ranks, double n1, double t1, double n2, double t2);

// A pipeline step through the schedule simulator (pipeline/simulate.h): `schedule` (fthenb, 1f1b,
// interleaved, zbh1) over `stages` ranks and `micro_batches`; forward / backward are one
// micro-batch's seconds on one rank's share of the layers (a virtual stage takes 1/virtual of them;
// a split backward half input, half weight gradient); `send` the seconds of one activation message.
struct PipelineTime {
  double step = 0;            // seconds
  double bubble_fraction = 0;  // the worst rank's idle share of the step
};
PipelineTime pipeline_time(const std::string& schedule, int stages, int micro_batches, int virtual_stages,
                           double forward, double backward, double send);

// The same, each schedule generated once (the search simulates many candidates of one schedule):
// make_schedule's work is kept by (schedule, stages, micro-batches, virtual stages).
class PipelineTimer {
 public:
  PipelineTime operator()(const std::string& schedule, int stages, int micro_batches, int virtual_stages,
                          double forward, double backward, double send);

 private:
  std::map<std::tuple<std::string, int, int, int>, pipeline::Schedule> schedules_;
};

}  // namespace shardwise::plan
