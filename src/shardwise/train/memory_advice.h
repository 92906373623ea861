#pragma once
// What makes a run that does not fit its memory limit fit (`shardwise plan --memory`, the refusal
// of `train --memory-limit`): the largest part of the largest rank's peak, and the same run with
// one change at a time planned again by plan_memory (memory_plan.h), each with its estimate — a
// smaller micro-batch (the global batch kept: more accumulation), activation recompute, bf16
// parameters, a sharding stage — and, when no single change fits, them together. A change the run's
// checks refuse (a micro-batch that does not divide the batch) is not offered.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardwise/train/memory_plan.h"

namespace shardwise::train {

struct MemoryChange {
  std::string change;  // the options that make it: "--micro-batch 2 (accumulation 16, the same global batch)"
  int64_t bytes = 0;   // the per-process estimate with it
  bool fits = false;
};

struct MemoryAdvice {
  std::string cause;        // the largest part of the largest rank's peak: "activations and working buffers"
  int64_t cause_bytes = 0;
  std::string cause_detail;  // what sets it: "micro-batch 32 x 2048 tokens"
  std::vector<MemoryChange> changes;  // planned, the likeliest fix for the cause first
  std::string more_ranks;             // the change no plan here estimates
  // The first change that fits, or nullptr.
  const MemoryChange* fix() const;
  // "--micro-batch 2 (...) (9.10 GiB, fits), --recompute full (40.0 GiB), ..., more tp / pp ranks ...".
  std::string changes_text() const;
  nlohmann::json to_json() const;
};

// The advice for `plan` of `c` (checked) over `limit` bytes (> 0) per process.
MemoryAdvice advise_memory(const TrainConfig& c, const MemoryPlan& plan, int64_t limit);

// `plan --memory`'s verdict on a plan over `limit`: "does not fit: ..." with the largest cause, the
// change that fixes it and its estimate, then the other changes (several lines).
std::string does_not_fit(const MemoryPlan& plan, const MemoryAdvice& advice, int64_t limit,
                         const std::string& limit_text);

// Error (naming the estimate, its largest parts and the changes that would make it fit) when the
// plan's per-process bytes exceed `limit` (> 0).
void check_memory_limit(const TrainConfig& c, const MemoryPlan& plan, int64_t limit, const std::string& limit_text);

}  // namespace shardwise::train
