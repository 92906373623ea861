#pragma once
// `shardwise calibrate`'s kernel fits (docs/planner.md): short training runs of small reference
// models on one rank (GPT-2, Llama, a Mixtral-style MoE; one kernel thread), each instruction type's
// measured seconds a step (the runtime's profile) set against the step-time model's own seconds of
// the same programs (plan --predict over the machine measured so far), fitted per type as
// measured = count x overhead_s + scale x modelled (plan/cost.h fit_kernel); and what a step spends
// outside the instructions and the optimizer, fitted as step_overhead_s + instruction_gap_s x the
// instructions a step.
#include <nlohmann/json.hpp>

#include "shardwise/plan/cluster.h"

namespace shardwise::cli {

// `machine`: the calibration so far (GEMM rates, memory bandwidth, the optimizer's rate) without
// kernel fits. Returns {"references": [...], "kernels": {type: {overhead_s, scale, samples}},
// "step_overhead_s", "instruction_gap_s"}. `quick`: two tiny references, fewer steps.
nlohmann::json measure_kernels(const plan::ClusterSpec& machine, bool quick);

}  // namespace shardwise::cli
