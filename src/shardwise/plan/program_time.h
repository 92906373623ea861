#pragma once
// The step-time model over one rank's lowered program (graph/program.h; docs/planner.md):
//   a kernel (forward or backward instruction) takes max(FLOPs / rate, bytes / memory bandwidth),
//     its FLOPs: matmul 2 m n k per batch item (its backward twice that: both operand gradients),
//     causal flash attention and the fused LM head their GEMMs' (instr_work), every other op none
//     (memory-bound); the rate: the measured GEMM shape nearest to its own (a calibration) or the
//     peak (plan/cost.h gemm_seconds); its bytes: its operands' and results' local blocks;
//   a fill writes its result;
//   the vocab-parallel head's own all-reduces (head_collectives) run on its group's link;
//   a reshard's steps run on the links their groups sit on (plan/cost.h), each step's bytes as the
//     reshard planner counts them (the ring's share sent by the busiest rank) plus its latency steps.
// A calibration's kernel fit of the instruction's type (ClusterSpec::kernel_fits) turns a kernel's or
// fill's seconds into overhead_s + scale x them (plan/cost.h fitted_seconds).
// Instructions run one after another (no overlap inside a program).
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "shardwise/graph/program.h"
#include "shardwise/plan/cluster.h"

namespace shardwise::plan {

struct ProgramTime {
  double compute_s = 0;  // kernels and fills
  double flops = 0;      // of the kernels
  std::map<std::string, double> collective_s;  // per reshard step kind: "all_reduce", ...
  // per instruction type as `train --profile` names them: the op ("matmul"), its backward
  // ("matmul_grad"), "reshard"
  std::map<std::string, double> by_op;
  std::map<std::string, int64_t> count_by_op;  // instructions of each type
  double collectives() const;
  double total() const { return compute_s + collectives(); }
};

// The program's time on the rank of `mesh` that is process `process` (its global rank: the ranks a
// group spans decide intra- or inter-node), kernels at the peak of `dtype`; `order`: the
// instructions to count (indices into p.instrs; empty: all of them).
ProgramTime program_time(const graph::Graph& g, const graph::Program& p, int64_t process, const ClusterSpec& c,
                         const std::string& dtype, std::span<const int> order = {});

// The FLOPs of one instruction on the rank at `coords` of p.mesh and the GEMM shape they are timed
// at (m x k by k x n): matmul's own, q k^T's for flash attention (S x D by D x S), the head's logits
// (N x h by h x V); no FLOPs for the other ops.
struct InstrWork {
  double flops = 0;
  int64_t m = 1, n = 1, k = 1;
};
InstrWork instr_work(const graph::Graph& g, const graph::Program& p, const graph::Instr& ins,
                     std::span<const int64_t> coords);
// The all-reduces the vocab-parallel fused head (`vocab_parallel_lm_head_cross_entropy`) makes
// inside its kernel over the ranks holding the other vocabulary blocks (ops/softmax/lm_head.cc):
// for every chunk of rows (chunk_bytes of f32 logits, ops::lm_head_chunk_rows) the forward
// all-reduces the rows' max (8 bytes a row) and then their sums of exponentials with the target
// logits (16 bytes a row); a backward that recomputes the logits (the forward formed not both
// gradients) the max and the sums again (8 + 8). `bytes`: each all-reduce's buffer; `mesh_dims`:
// the mesh dims sharding the weight's vocabulary. Empty for every other instruction.
struct HeadCollectives {
  std::vector<double> bytes;
  std::vector<int> mesh_dims;
};
HeadCollectives head_collectives(const graph::Graph& g, const graph::Program& p, const graph::Instr& ins,
                                 std::span<const int64_t> coords);
// instr_work's FLOPs.
double instr_flops(const graph::Graph& g, const graph::Program& p, const graph::Instr& ins,
                   std::span<const int64_t> coords);

}  // namespace shardwise::plan
