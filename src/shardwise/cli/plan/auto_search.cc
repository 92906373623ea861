#include "shardwise/cli/plan/auto_search.h"

#include <algorithm>
#include <chrono>

#include "shardwise/cli/plan/calibrate_cmd.h"
#include "shardwise/cli/plan/predict.h"
#include "shardwise/comm/mpi.h"
#include "shardwise/core/error.h"
#include "shardwise/mesh/strategy.h"
#include "shardwise/plan/analytic.h"
#include "shardwise/train/memory_plan.h"

namespace shardwise::cli {

namespace {

// The cluster searched: a description as given (its first `devices` devices), or this machine's
// calibration with `devices` ranks sharing its memory on one node.
plan::ClusterSpec searched_cluster(const AutoOptions& o) {
  plan::ClusterSpec c = o.cluster.empty() ? load_calibration(o.mpi) : plan::load_cluster(o.cluster);
  if (o.cluster.empty() && o.devices > 0) {
    const double machine = c.memory_bytes * static_cast<double>(c.devices());
    c.nodes = 1, c.devices_per_node = o.devices, c.memory_bytes = machine / static_cast<double>(o.devices);
  }
  SW_CHECK(o.devices <= c.devices(), "plan --auto: --devices {} is more than cluster '{}' has ({})", o.devices, c.name,
           c.devices());
  return c;
}

plan::SearchSpace search_space(const train::TrainConfig& base, int64_t devices, const plan::ClusterSpec& c,
                               int64_t max_micro_batch) {
  const train::GptConfig& m = base.model;
  plan::SearchSpace s;
  s.devices = devices, s.devices_per_node = std::min(devices, c.devices_per_node);
  s.layers = m.layers, s.heads = m.heads, s.kv_heads = m.key_value_heads(), s.hidden = m.hidden;
  s.mlp_width = m.mlp_width(), s.vocab = m.vocab, s.seq = m.seq, s.experts = m.experts;
  s.global_batch = base.optimizer.global_batch;
  s.max_micro_batch = max_micro_batch;
  return s;
}

plan::ModelSize model_size(const train::GptConfig& m) {
  plan::ModelSize z;
  z.layers = m.layers, z.heads = m.heads, z.kv_heads = m.key_value_heads(), z.head_dim = m.head_size();
  z.hidden = m.hidden, z.mlp_width = m.mlp_width(), z.vocab = m.vocab, z.seq = m.seq;
  z.experts = m.experts, z.top_k = m.top_k, z.swiglu = m.is_llama(), z.tied = !m.is_llama() || m.tie_word_embeddings;
  z.fused_attention = m.fused_attention();
  z.bf16_compute = m.compute_dtype == DType::BF16;
  return z;
}

// The base run with its derived sizes (seq 0: the data's) filled in and checked on one rank.
train::TrainConfig resolved_base(train::TrainConfig base) {
  base.parallel.mesh = "dp=1", base.parallel.schedule = "1f1b", base.parallel.virtual_stages = 1;
  base.parallel.sharding.stage = 0, base.parallel.overlap_grad_reduce = "off";
  base.optimizer.micro_batch = base.optimizer.accumulation = 0;
  base.check(1, false);
  return base;
}

}  // namespace

train::TrainConfig candidate_config(const train::TrainConfig& base, const plan::Candidate& c) {
  train::TrainConfig tc = base;
  tc.parallel.mesh = c.mesh();
  tc.parallel.sequence_parallel = c.sequence_parallel;
  tc.parallel.sharding.stage = c.sharding_stage;
  tc.parallel.schedule = c.pp > 1 ? c.schedule : "1f1b";
  tc.parallel.virtual_stages = c.pp > 1 ? c.virtual_stages : 1;
  tc.parallel.overlap_grad_reduce = c.sharding_stage < 3 && c.dp * c.ep > 1 ? "on" : "off";
  tc.model.recompute = c.recompute;
  tc.optimizer.micro_batch = c.micro_batch;
  tc.optimizer.accumulation = c.accumulation;
  tc.check(c.dp * c.tp * c.pp * c.ep, false);
  return tc;
}

std::string candidate_options(const plan::Candidate& c) {
  std::string out = fmt::format("--mesh {}", c.mesh());
  if (c.sequence_parallel) out += " --sp";
  if (c.sharding_stage > 0) out += fmt::format(" --sharding-stage {}", c.sharding_stage);
  if (c.sharding_stage < 3 && c.dp * c.ep > 1) out += " --overlap-grad-reduce on";
  if (c.recompute != "none") out += " --recompute " + c.recompute;
  out += fmt::format(" --micro-batch {} --accumulation {}", c.micro_batch, c.accumulation);
  if (c.pp > 1) out += " --schedule " + c.schedule;
  if (c.virtual_stages > 1) out += fmt::format(" --virtual {}", c.virtual_stages);
  return out;
}

plan::StepEstimate predict_analytic(const train::TrainConfig& tc, const plan::ClusterSpec& cluster) {
  const train::Strategy s = train::Strategy::from_mesh(mesh::parse_mesh(tc.parallel.mesh), tc.parallel.sequence_parallel);
  plan::Candidate c;
  c.dp = s.dp_size(), c.tp = s.tp_size(), c.ep = s.ep_size(), c.cp = s.cp_size();
  c.pp = s.pp < 0 ? 1 : s.mesh.dim_size(s.pp);
  SW_CHECK(c.dp * c.tp * c.pp * c.ep * c.cp == s.mesh.size(),
           "--analytic: the mesh {} has a dim other than dp, tp, pp, ep, cp", s.mesh.to_string());
  c.sequence_parallel = tc.parallel.sequence_parallel;
  c.sharding_stage = tc.parallel.sharding.stage;
  c.recompute = tc.model.recompute;
  SW_CHECK(c.recompute == "none" || c.recompute == "full", "--analytic: --recompute {} (the analytic model knows none "
           "and full)", c.recompute);
  c.micro_batch = tc.optimizer.micro_batch, c.accumulation = tc.optimizer.accumulation;
  c.schedule = tc.parallel.schedule, c.virtual_stages = tc.parallel.virtual_stages;
  SW_CHECK(tc.model.layers >= c.pp * c.virtual_stages, "--analytic: {} layers do not fill {} stages ({} x {} virtual)",
           tc.model.layers, c.pp * c.virtual_stages, c.pp, c.virtual_stages);
  return plan::analytic_estimate(cluster, model_size(tc.model), c, tc.optimizer.global_batch, tc.bf16 ? "bf16" : "f32");
}

std::string choose_for_train(const nlohmann::json& given, train::TrainConfig& c, int64_t ranks) {
  std::vector<std::string> chosen_given;
  for (const char* name : {"mesh", "sp", "sharding-stage", "recompute", "micro-batch", "accumulation", "micro-batches",
                           "schedule", "virtual", "overlap-grad-reduce"})
    if (given.contains(name)) chosen_given.push_back(std::string("--") + name);
  SW_CHECK(chosen_given.empty(),
           "--auto chooses the mesh, --sp, --sharding-stage, --recompute, the batch split, the schedule and "
           "--overlap-grad-reduce: leave out {} (or leave out --auto)",
           fmt::join(chosen_given, ", "));
  const AutoSearch s = auto_search(c, AutoOptions{ranks, "", 0.1, 0, false, comm::launched_by_mpirun()});
  const RankedCandidate& best = s.ranked.front();
  const train::TrainConfig tc = candidate_config(c, best.candidate);
  c.parallel = tc.parallel;
  c.model.recompute = tc.model.recompute;
  c.optimizer.micro_batch = tc.optimizer.micro_batch;
  c.optimizer.accumulation = tc.optimizer.accumulation;
  return fmt::format("auto: {} ({}), the fastest of {} candidates plan --auto predicts on {} ({} combinations "
                     "searched in {:.2f} s): {:.4g} s a step, {:.4g} tokens/s",
                     best.candidate.describe(), candidate_options(best.candidate), s.ranked.size(), s.cluster.name,
                     s.enumeration.considered, s.seconds, best.estimate.step, best.estimate.tokens_per_s);
}

AutoSearch auto_search(const train::TrainConfig& original, const AutoOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  SW_CHECK(o.memory_margin >= 0 && o.memory_margin < 1, "--memory-margin must be in [0, 1), got {}", o.memory_margin);
  AutoSearch r;
  r.cluster = searched_cluster(o);
  const int64_t devices = o.devices > 0 ? o.devices : r.cluster.devices();
  const train::TrainConfig base = resolved_base(original);
  r.space = search_space(base, devices, r.cluster, o.max_micro_batch);
  r.enumeration = plan::enumerate_candidates(r.space);
  r.analytic = o.analytic || devices > plan::kExactSearchDevices;
  const std::string dtype = base.bf16 ? "bf16" : "f32";
  const double limit = r.cluster.memory_bytes * (1 - o.memory_margin);
  const plan::ModelSize size = model_size(base.model);
  plan::AnalyticTimer timer;
  for (const plan::Candidate& c : r.enumeration.kept) {
    plan::StepEstimate e;
    if (r.analytic) {
      if (static_cast<double>(plan::analytic_memory(size, c, base.optimizer.global_batch, dtype)) > limit) {
        ++r.over_memory;
        continue;
      }
      e = plan::analytic_estimate(r.cluster, size, c, base.optimizer.global_batch, dtype, &timer, false);
    } else {
      try {
        const train::TrainConfig tc = candidate_config(base, c);
        const int64_t peak = train::plan_memory(tc, true).largest().peak();
        if (static_cast<double>(peak) > limit) {
          ++r.over_memory;
          continue;
        }
        e = predict_program(tc, r.cluster);
        e.memory = peak;
      } catch (const Error& err) {
        if (r.refused++ == 0) r.first_refusal = fmt::format("{}: {}", c.describe(), err.what());
        continue;
      }
    }
    r.ranked.push_back({c, e});
  }
  std::stable_sort(r.ranked.begin(), r.ranked.end(), [](const RankedCandidate& a, const RankedCandidate& b) {
    return a.estimate.step < b.estimate.step;
  });
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  SW_CHECK(!r.ranked.empty(),
           "plan --auto: no candidate fits: {} combinations searched, {} kept by the rules, {} over {:.0f}% of each device's "
           "{:.3g} GB, {} refused by train's checks{}",
           r.enumeration.considered, r.enumeration.kept.size(), r.over_memory, 100 * (1 - o.memory_margin),
           r.cluster.memory_bytes / 1e9, r.refused, r.first_refusal.empty() ? "" : " (first: " + r.first_refusal + ")");
  return r;
}

}  // namespace shardwise::cli
