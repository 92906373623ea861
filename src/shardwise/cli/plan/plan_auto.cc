// `shardwise plan --auto`: the fastest candidates of the search (cli/plan/auto_search.h), each with
// its mesh and options, predicted step time, tokens/s, MFU, memory per device and the share of each
// part of the step; how many combinations were searched, what each rule removed, and the time.
#include <nlohmann/json.hpp>

#include "shardwise/cli/commands.h"
#include "shardwise/cli/plan/auto_search.h"
#include "shardwise/cli/plan/calibrate_cmd.h"
#include "shardwise/cli/plan/predict.h"
#include "shardwise/train/memory_plan.h"

namespace shardwise::cli {

namespace {

nlohmann::json candidate_json(const RankedCandidate& r) {
  const plan::Candidate& c = r.candidate;
  nlohmann::json shares = nlohmann::json::object();
  for (const auto& [name, sec] : ordered_parts(r.estimate)) shares[name] = sec / r.estimate.step;
  return {{"mesh", c.mesh()},
          {"sequence_parallel", c.sequence_parallel},
          {"sharding_stage", c.sharding_stage},
          {"recompute", c.recompute},
          {"micro_batch", c.micro_batch},
          {"accumulation", c.accumulation},
          {"schedule", c.pp > 1 ? c.schedule : ""},
          {"virtual_stages", c.virtual_stages},
          {"train_options", candidate_options(c)},
          {"step_time_s", r.estimate.step},
          {"tokens_per_s", r.estimate.tokens_per_s},
          {"mfu", r.estimate.mfu},
          {"memory_bytes", r.estimate.memory},
          {"shares", shares}};
}

std::string shares_text(const plan::StepEstimate& e) {
  std::string out;
  for (const auto& [name, sec] : ordered_parts(e)) {
    if (sec >= 0.005 * e.step) out += fmt::format("{}{} {:.0f}%", out.empty() ? "" : ", ", name, 100 * sec / e.step);
  }
  return out;
}

std::string removed_text(const AutoSearch& s) {
  std::string out;
  for (const char* rule : plan::kSearchRules) {
    const auto it = s.enumeration.removed.find(rule);
    if (it != s.enumeration.removed.end()) out += fmt::format("{}{} {}", out.empty() ? "" : ", ", rule, it->second);
  }
  out += fmt::format("{}memory {}", out.empty() ? "" : ", ", s.over_memory);
  if (s.refused > 0) out += fmt::format(", train's checks {}", s.refused);
  return out;
}

}  // namespace

int cmd_plan_auto(const TrainOptions& options, const PlanOptions& o, std::ostream& out) {
  const AutoOptions ao{o.devices, o.cluster, o.memory_margin, o.max_micro_batch, o.analytic,
                        o.cluster.empty() && predicts_mpi(o.backend)};
  const AutoSearch s = auto_search(options.config, ao);
  const size_t top = std::min(s.ranked.size(), static_cast<size_t>(std::max<int64_t>(o.top, 1)));
  const char* model = s.analytic ? "analytic per-layer model" : "compiled programs";
  if (options.logging.json) {
    nlohmann::json j = {{"cluster", s.cluster.name},
                        {"devices", s.space.devices},
                        {"model", s.analytic ? "analytic" : "programs"},
                        {"searched", s.enumeration.considered},
                        {"kept_by_rules", s.enumeration.kept.size()},
                        {"removed", s.enumeration.removed},
                        {"over_memory", s.over_memory},
                        {"refused_by_checks", s.refused},
                        {"predicted", s.ranked.size()},
                        {"seconds", s.seconds},
                        {"memory_margin", o.memory_margin},
                        {"candidates", nlohmann::json::array()}};
    for (size_t i = 0; i < top; ++i) j["candidates"].push_back(candidate_json(s.ranked[i]));
    out << j.dump(1) << "\n";
    return 0;
  }
  out << fmt::format("plan --auto on {} ({} devices, {} a node), global batch {} x seq {}: {} combinations searched in "
                     "{:.2f} s ({}); removed: {}; {} predicted\n",
                     s.cluster.name, s.space.devices, s.space.devices_per_node, s.space.global_batch, s.space.seq,
                     s.enumeration.considered, s.seconds, model, removed_text(s), s.ranked.size());
  out << fmt::format("memory rule: peak per device within {:.0f}% of {}\n", 100 * (1 - o.memory_margin),
                     train::human_bytes(static_cast<int64_t>(s.cluster.memory_bytes)));
  for (size_t i = 0; i < top; ++i) {
    const RankedCandidate& r = s.ranked[i];
    out << fmt::format("{:>2}. {}\n    step {:.4g} s, {:.4g} tokens/s, MFU {:.1f}%, memory {} a device; {}\n", i + 1,
                       r.candidate.describe(), r.estimate.step, r.estimate.tokens_per_s, 100 * r.estimate.mfu,
                       train::human_bytes(r.estimate.memory), shares_text(r.estimate));
  }
  out << "train options of the best: " << candidate_options(s.ranked.front().candidate) << "\n";
  return 0;
}

}  // namespace shardwise::cli
