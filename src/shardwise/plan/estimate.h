#pragma once
// A candidate's predicted step (`plan --predict`, `plan --auto`): by the program model
// (plan/program_time.h over the compiled stages) or the analytic one (plan/analytic.h).
#include <cstdint>
#include <map>
#include <string>

namespace shardwise::plan {

// What a candidate is predicted to take and hold; the same fields the program model fills.
struct StepEstimate {
  double step = 0;       // seconds
  double flops = 0;      // counted FLOPs of a device in a step (recompute included)
  double tokens_per_s = 0, mfu = 0;
  // seconds a step: "compute", each collective kind, "grad_sync", "optimizer", "bubble"
  // (their sum is the step)
  std::map<std::string, double> parts;
  int64_t memory = 0;  // peak bytes per device
  // The program model only: seconds a step per instruction type of the slowest pipeline rank, as
  // `train --profile` names them ("matmul", "matmul_grad", "reshard", ...; "optimizer adamw").
  std::map<std::string, double> by_op;
  std::map<std::string, double> count_by_op;  // instructions of each type a step on that rank
};

}  // namespace shardwise::plan
