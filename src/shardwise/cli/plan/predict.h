#pragma once
// The program model's prediction of one step of a `train` run (`plan --predict`, `plan --auto`,
// `train --auto`; docs/planner.md): each pipeline rank's stages compiled once, timed instruction by
// instruction, the schedule simulated, the gradient sync and the optimizer added.
#include <string>
#include <utility>
#include <vector>

#include "shardwise/plan/cluster.h"
#include "shardwise/plan/estimate.h"
#include "shardwise/train/train_config.h"

namespace shardwise::cli {

// `tc` must have passed TrainConfig::check. `memory` is left 0 (the memory plan's to fill).
plan::StepEstimate predict_program(const train::TrainConfig& tc, const plan::ClusterSpec& cluster);

// The instructions a step of the slowest pipeline rank runs (its count_by_op's sum).
double instruction_count(const plan::StepEstimate& e);

// The parts in the order they are shown: compute, the collectives, grad_sync, optimizer, bubble.
std::vector<std::pair<std::string, double>> ordered_parts(const plan::StepEstimate& e);

}  // namespace shardwise::cli
