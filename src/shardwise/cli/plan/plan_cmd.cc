// `shardwise plan`: the completed, lowered program of the GPT model on a mesh — every node with
// its operands' placements and every reshard with its collectives and bytes — or, with
// --explain, which rule and which neighbour decided one value's placement.
#include <chrono>

#include "shardwise/cli/ckpt_cmd.h"
#include "shardwise/cli/commands.h"
#include "shardwise/cli/plan/plan_names.h"
#include "shardwise/cli/train/run_header.h"
#include "shardwise/comm/mpi.h"
#include "shardwise/core/error.h"
#include "shardwise/graph/autodiff.h"
#include "shardwise/graph/program.h"
#include "shardwise/models/gpt.h"
#include "shardwise/models/models.h"
#include "shardwise/train/memory_advice.h"
#include "shardwise/train/memory_plan.h"
#include "shardwise/train/moe_plan.h"
#include "shardwise/core/plural.h"

namespace shardwise::cli {

int cmd_plan(const TrainOptions& options, const PlanOptions& plan_options, std::ostream& out) {
  PlanOptions o = plan_options;
  o.auto_search = options.auto_plan;  // --auto is train's flag, which plan shows as the search
  SW_CHECK(o.cluster.empty() || o.predict || o.auto_search, "--cluster goes with --predict or --auto");
  SW_CHECK(o.predict + o.memory + o.auto_search <= 1, "--predict, --memory and --auto: choose one");
  SW_CHECK(o.auto_search || (o.devices == 0 && o.max_micro_batch == 0), "--devices and --max-micro-batch go with --auto");
  SW_CHECK(o.memory || !o.symmetric, "--symmetric goes with --memory");
  SW_CHECK(o.memory || o.kept == 0, "--kept goes with --memory");
  SW_CHECK(o.kept >= 0, "--kept {}: give how many tensors to show (a count of 1 or more)", o.kept);
  SW_CHECK(o.backend == "auto" || o.predict || o.auto_search, "--backend goes with --predict or --auto");
  SW_CHECK(o.cluster.empty() || o.backend == "auto",
           "--backend {} is for this machine's calibration: a cluster description ({}) has its own links", o.backend,
           o.cluster);
  if (o.auto_search) return cmd_plan_auto(options, o, out);
  if (o.memory) return cmd_plan_memory(options, o, out);
  SW_CHECK(!o.analytic || o.predict || o.auto_search, "--analytic goes with --predict or --auto");
  if (o.predict) return cmd_plan_predict(options, o, out);
  train::TrainConfig tc = options.config;
  tc.check(options.ranks > 0 ? options.ranks : mesh::parse_mesh(tc.parallel.mesh).size(), false);  // train's checks and derived sizes
  const train::GptConfig c = train::kernel_model(tc);
  const train::Strategy s = train::Strategy::from_mesh(mesh::parse_mesh(tc.parallel.mesh), tc.parallel.sequence_parallel);
  SW_CHECK(s.pp < 0, "plan shows one program on a mesh without pp ({} has a pp dim): see a pipeline's stages with "
           "`shardwise plan --memory` and its schedule with `shardwise pipeline`", s.mesh.to_string());
  const CheckpointNames names(c);
  auto start = std::chrono::steady_clock::now();
  train::GptGraph m = train::build_model(c, s, tc.optimizer.micro_batch * s.data_size());
  graph::append_backward(m.g, m.loss);
  graph::Completion done = graph::complete(m.g, s.mesh);
  graph::Program p = graph::lower(m.g, done);
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  int64_t parameters = 0;
  for (bool trained : {true, false}) {
    for (graph::ValueId v : trained ? m.g.params() : m.g.frozen_params()) parameters += m.g.value(v).meta.shape.numel();
  }
  if (!o.explain.empty()) {
    for (const std::string& name : o.explain) out << names.rename(graph::explain(m.g, done, m.g.get(names.graph_name(name)))) << "\n";
    return 0;
  }
  if (!o.summary) out << names.legend() << names.rename(p.to_string(m.g));
  else {
    out << fmt::format("reshards: {:.3g} us estimated, {} B sent by the busiest rank; collectives:", p.reshard_cost_s * 1e6,
                       p.reshard_bytes);
    for (auto& [kind, count] : p.collective_counts()) out << fmt::format(" {} x{}", kind, count);
    out << "\n";
  }
  out << fmt::format("{} {}, hidden {}, {}, seq {}, vocab {}: {} parameters; micro-batch {} per data rank{} on "
                     "{}: {} nodes, {} instructions; built, differentiated, completed and lowered in {:.1f} ms\n",
                     train::describe_architecture(c), counted(c.layers, "layer"), c.hidden, counted(c.heads, "head"), c.seq, c.vocab,
                     count_text(parameters), tc.optimizer.micro_batch,
                     c.lora.enabled() ? fmt::format(", LoRA r {} on {} (base frozen)", c.lora.rank,
                                                    train::lora_targets_text(c))
                                      : "",
                     s.to_string(), m.g.nodes().size(), p.instrs.size(), ms);
  return 0;
}

}  // namespace shardwise::cli

// `shardwise plan --memory`, `train --dry-run` and the memory check of every `train`.
namespace shardwise::cli {

int64_t memory_limit_bytes(const std::string& text) {
  if (text == "auto") return train::available_memory();
  if (text == "none" || text == "0") return 0;
  try {
    return static_cast<int64_t>(parse_byte_size(text));
  } catch (const Error&) {
    fail("--memory-limit '{}': use auto (the machine's available memory), none, or a size such as 24GiB or 1.5GB", text);
  }
}

void check_run_memory(const train::TrainConfig& c, const TrainOptions& o, bool threads, bool print, std::ostream& out,
                      bool refuse, bool symmetric, int kept) {
  const int64_t limit = memory_limit_bytes(o.memory_limit);  // a bad value is refused before the plan
  if (!print && limit == 0) return;
  const train::MemoryPlan plan = train::plan_memory(c, threads, symmetric, kept > 0);
  const train::MoeTraffic moe = train::moe_traffic(c);  // an MoE model's all-to-alls
  const bool fits = limit == 0 || plan.per_process() <= limit;
  if (print && o.logging.json) {
    nlohmann::json j = plan.to_json();
    if (moe.moe_layers > 0) j["moe_traffic"] = moe.to_json();
    j["memory_limit"] = limit;
    j["fits"] = fits;
    if (!fits) j["advice"] = train::advise_memory(c, plan, limit).to_json();
    out << j.dump(2) << "\n";
  } else if (print) {
    out << plan.table() << moe.table() << (kept > 0 ? plan.kept_table(kept) : "");
    if (fits && limit > 0) out << fmt::format("--memory-limit {} ({} bytes): fits\n", o.memory_limit, limit);
    if (!fits) out << train::does_not_fit(plan, train::advise_memory(c, plan, limit), limit, o.memory_limit);
  }
  out.flush();
  if (refuse) train::check_memory_limit(c, plan, limit, o.memory_limit);
}

int cmd_plan_memory(const TrainOptions& o, const PlanOptions& plan, std::ostream& out) {
  train::TrainConfig c = o.config;
  const int64_t ranks = o.ranks > 0 ? o.ranks : mesh::parse_mesh(c.parallel.mesh).size();
  c.check(ranks, false);
  check_run_memory(c, o, !comm::launched_by_mpirun(), true, out, plan.check, plan.symmetric, plan.kept);
  return 0;
}

}  // namespace shardwise::cli
