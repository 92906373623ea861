// `shardwise plan --predict`: the step time the model predicts for the run `train` describes
// (docs/planner.md): each pipeline rank's stages compiled once as the trainer cuts them (every rank
// of a stage runs the same program on its own blocks), timed instruction by instruction
// (plan/program_time.h) for one micro-batch's forward and backward, the schedule simulated over the
// slowest rank's times (plan/cost.h), plus the gradient all-reduce over the data ranks the trainer
// does itself and the AdamW update (memory-bound).
#include <cmath>
#include <nlohmann/json.hpp>

#include "shardwise/cli/plan/auto_search.h"
#include "shardwise/cli/plan/calibrate_cmd.h"
#include "shardwise/cli/plan/predict.h"
#include "shardwise/cli/commands.h"
#include "shardwise/core/error.h"
#include "shardwise/graph/program.h"
#include "shardwise/mesh/shard_math.h"
#include "shardwise/models/models.h"
#include "shardwise/pipeline/stage.h"
#include "shardwise/train/staged.h"
#include "shardwise/plan/cost.h"
#include "shardwise/plan/program_time.h"

namespace shardwise::cli {

namespace {

// One pipeline rank's stages (the whole program without pp), each compiled once as the trainer
// cuts it (train/staged.h) and timed on the stage mesh's first process: every other rank of the
// stage runs the same instructions on its own blocks.
struct RankWork {
  double forward = 0, backward = 0, compute = 0, flops = 0;  // one micro-batch
  std::map<std::string, double> collectives;                 // one micro-batch
  std::map<std::string, double> by_op;                       // one micro-batch
  std::map<std::string, double> count_by_op;                 // one micro-batch
  int64_t grad_numel = 0;  // trained parameters' local elements whose data-rank sums the trainer reduces
  int64_t numel = 0;       // trained parameters' local elements
  int64_t tensors = 0, grad_tensors = 0;  // trained parameters, and those of grad_numel
};

int64_t local_numel(const graph::Graph& g, const graph::Program& p, int64_t process) {
  const auto coords = p.mesh.coords(p.mesh.rank_index_of_process(process));
  int64_t n = 0;
  for (graph::ValueId v : g.params()) {
    const graph::Slot& s = p.slots[static_cast<size_t>(p.value_slot[static_cast<size_t>(v)])];
    n += mesh::local_shape(s.meta.shape, s.dist, p.mesh, coords).numel();
  }
  return n;
}

RankWork rank_work(const train::GptConfig& c, const train::StageLayout& layout, const train::PipelineConfig& pc,
                   int64_t sequences, int pipeline_rank, const plan::ClusterSpec& cluster, const std::string& dtype) {
  RankWork w;
  for (pipeline::StageSpec& spec :
       train::stage_specs(c, layout, pc, sequences, pipeline_rank, train::StageGraph::Training)) {
    const mesh::ProcessMesh& mesh = layout.meshes[static_cast<size_t>(spec.stage)];
    pipeline::CompiledStage cs = pipeline::compile_stage(spec, mesh, layout.schedule.split_backward);
    const int64_t process = mesh.process_ids().front();
    const std::span<const int> order(cs.order);
    for (bool forward : {true, false}) {
      plan::ProgramTime t = plan::program_time(*spec.graph, cs.program, process, cluster, dtype,
                                               forward ? order.first(cs.forward_end) : order.subspan(cs.forward_end));
      (forward ? w.forward : w.backward) += t.total();
      w.compute += t.compute_s;
      w.flops += t.flops;
      for (const auto& [kind, sec] : t.collective_s) w.collectives[kind] += sec;
      for (const auto& [op, sec] : t.by_op) w.by_op[op] += sec;
      for (const auto& [op, n] : t.count_by_op) w.count_by_op[op] += static_cast<double>(n);
    }
    const int64_t n = local_numel(*spec.graph, cs.program, process);
    w.numel += n;
    const auto tensors = static_cast<int64_t>(spec.graph->params().size());
    w.tensors += tensors;
    if (!spec.partial_grad_dims.empty()) w.grad_numel += n, w.grad_tensors += tensors;
  }
  return w;
}

// The data ranks' gradient sync the trainer does itself and the AdamW update, by sharding stage
// (train/sharding.h): stage 0 all-reduces the gradients the stage leaves Partial and updates every
// parameter; stages 1 and 2 update the rank's 1/d share of them (d: the data group) and all-gather
// the updated parameters, stage 2 reduce-scattering the Partial gradients instead of all-reducing
// them; stage 3's parameters are shards already and its program holds the collectives. Each call
// is timed as a reshard: one a bucket with --overlap-grad-reduce, else one a gradient; the
// all-gather one a parameter (layout v1) or one (v2).
void add_data_sync(const train::TrainConfig& tc, const train::StageLayout& layout, const RankWork& w,
                   const plan::ClusterSpec& cluster, plan::StepEstimate& r) {
  std::vector<int> group;
  const std::vector<int> data_dims = layout.stage_strategy.data_dims();
  if (!data_dims.empty()) {
    std::vector<int64_t> members = layout.meshes[0].processes_along(layout.meshes[0].process_ids().front(),
                                                                    std::span<const int>(data_dims));
    group.assign(members.begin(), members.end());
  }
  const int d = std::max<int>(1, static_cast<int>(group.size()));
  const int stage = tc.parallel.sharding.stage;
  const bool sharded = (stage == 1 || stage == 2) && d > 1;
  // `calls` collectives of `kind` moving `bytes` in all over the data group, each timed as a reshard
  // (a calibration's "reshard" fit: the threads' collectives inside a step).
  auto synced = [&](plan::CollectiveKind kind, double bytes, double calls) {
    calls = std::max(1.0, calls);
    return calls * plan::fitted_seconds(cluster, "reshard",
                                        d > 1 ? plan::group_collective_seconds(cluster, kind, bytes / calls, group) : 0.0);
  };
  double grad_sync = 0;
  if (d > 1 && w.grad_numel > 0) {  // the buckets (--overlap-grad-reduce), else one call a gradient
    const double bytes = 4.0 * static_cast<double>(w.grad_numel);
    const double calls = tc.parallel.overlap_grad_reduce != "off"
                             ? std::ceil(bytes / (tc.parallel.grad_bucket_mb * 1024 * 1024))
                             : static_cast<double>(w.grad_tensors);
    grad_sync = synced(stage == 2 ? plan::CollectiveKind::ReduceScatter : plan::CollectiveKind::AllReduce, bytes, calls);
  }
  if (sharded) {  // the updated parameters gathered back (v1: each parameter from its owner)
    grad_sync += synced(plan::CollectiveKind::AllGather, static_cast<double>(w.numel) * (tc.bf16 ? 2.0 : 4.0),
                        tc.parallel.sharding.layout == "v1" ? static_cast<double>(w.tensors) : 1.0);
  }
  r.parts["grad_sync"] = grad_sync;
  // AdamW: the calibrated update rate, or p, g, m, v read and p, m, v written, f32.
  const double numel = static_cast<double>(w.numel) / (sharded ? d : 1);
  r.parts["optimizer"] = cluster.optimizer_elements_per_s > 0 ? numel / cluster.optimizer_elements_per_s
                                                               : plan::memory_seconds(cluster, 7 * 4.0 * numel);
}

// A part that is a collective's time (a kind of collective, or the gradient sync), not a rank's
// own work.
bool is_collective_part(const std::string& name) {
  return name != "compute" && name != "memory_bound" && name != "bubble" && name != "optimizer" &&
         name != "step_overhead";
}

}  // namespace

plan::StepEstimate predict_program(const train::TrainConfig& tc, const plan::ClusterSpec& cluster) {
  const train::GptConfig c = train::kernel_model(tc);
  const train::Strategy s = train::Strategy::from_mesh(mesh::parse_mesh(tc.parallel.mesh), tc.parallel.sequence_parallel);
  SW_CHECK(s.mesh.size() <= cluster.devices(), "plan --predict: the mesh {} needs {} devices; cluster '{}' has {}",
           s.mesh.to_string(), s.mesh.size(), cluster.name, cluster.devices());
  const train::PipelineConfig pc = train::pipeline_config(tc);
  const train::StageLayout layout = train::stage_layout(c, s, pc, static_cast<int>(tc.optimizer.accumulation));
  const std::string dtype = tc.bf16 ? "bf16" : "f32";
  const int pp = layout.schedule.ranks;
  // The slowest pipeline rank's micro-batch sets the pace: every stage is given its times.
  RankWork slowest;
  for (int r = 0; r < pp; ++r) {
    RankWork w = rank_work(c, layout, pc, tc.optimizer.micro_batch * s.data_size(), r, cluster, dtype);
    if (r == 0 || w.forward + w.backward > slowest.forward + slowest.backward) slowest = w;
  }
  double send = 0;
  if (pp > 1) {  // one micro-batch's residual stream from a stage's rank to the next stage's
    const double bytes = static_cast<double>(tc.optimizer.micro_batch * c.seq * c.hidden) * (tc.bf16 ? 2 : 4);
    std::vector<int> pair = {static_cast<int>(layout.meshes[0].process_ids().front()),
                             static_cast<int>(layout.meshes[1].process_ids().front())};
    send = plan::group_collective_seconds(cluster, plan::CollectiveKind::SendRecv, bytes, pair);
  }
  const plan::PipelineTime pipe = plan::pipeline_time(layout.schedule.name, pp, layout.schedule.micro_batches,
                                                      layout.schedule.virtual_stages, slowest.forward,
                                                      slowest.backward, send);
  plan::StepEstimate r;
  const double mbs = static_cast<double>(layout.schedule.micro_batches);
  r.parts["compute"] = mbs * slowest.compute;
  r.flops = mbs * slowest.flops;
  for (const auto& [kind, sec] : slowest.collectives) r.parts[kind] = mbs * sec;
  for (const auto& [op, sec] : slowest.by_op) r.by_op[op] = mbs * sec;
  r.parts["bubble"] = pipe.step - mbs * (slowest.forward + slowest.backward);
  for (const auto& [op, n] : slowest.count_by_op) r.count_by_op[op] = mbs * n;
  add_data_sync(tc, layout, slowest, cluster, r);
  // The trainer's own work a step and the runtime's between the slowest rank's instructions.
  const double outside = cluster.step_overhead_s + cluster.instruction_gap_s * instruction_count(r);
  if (outside > 0) r.parts["step_overhead"] = outside;
  r.step = pipe.step + r.parts["grad_sync"] + r.parts["optimizer"] + outside;
  r.by_op["optimizer adamw"] = r.parts["optimizer"];
  // The ranks' work on this machine's cores is slower by their contention (ranks / cores beyond
  // the cores, unless the cluster file sets a factor for this mesh or this many ranks; calibrate
  // sets none): the kernels, the optimizer, the trainer's own work and the bubble (the other
  // stages' slower work), and the collectives where a waiting rank holds its core (MPI's polling);
  // the threads' collectives wait on a condition variable and leave their core to a computing rank.
  const double contention = plan::mesh_factor(cluster, s.mesh.to_string(), s.mesh.size());
  double waits = 0;
  for (auto& [name, sec] : r.parts) {
    if (!cluster.waits_hold_cores && is_collective_part(name)) waits += sec;
    else sec *= contention;
  }
  r.step = (r.step - waits) * contention + waits;
  for (auto& [op, sec] : r.by_op) sec *= contention;
  r.tokens_per_s = static_cast<double>(tc.optimizer.global_batch * c.seq) / r.step;
  r.mfu = r.flops / r.step / cluster.peak(dtype);
  return r;
}

double instruction_count(const plan::StepEstimate& e) {
  double n = 0;
  for (const auto& [op, count] : e.count_by_op) n += count;
  return n;
}

std::vector<std::pair<std::string, double>> ordered_parts(const plan::StepEstimate& e) {
  std::vector<std::pair<std::string, double>> out;
  const char* last[] = {"grad_sync", "optimizer", "step_overhead", "bubble"};
  if (e.parts.contains("compute")) out.push_back({"compute", e.parts.at("compute")});
  for (const auto& [name, sec] : e.parts) {
    if (name != "compute" && std::find(std::begin(last), std::end(last), name) == std::end(last)) out.push_back({name, sec});
  }
  for (const char* name : last)
    if (e.parts.contains(name)) out.push_back({name, e.parts.at(name)});
  return out;
}

int cmd_plan_predict(const TrainOptions& options, const PlanOptions& plan_options, std::ostream& out) {
  const std::string& cluster_file = plan_options.cluster;
  const bool analytic = plan_options.analytic;
  train::TrainConfig tc = options.config;
  const int64_t ranks = options.ranks > 0 ? options.ranks : mesh::parse_mesh(tc.parallel.mesh).size();
  if (analytic && tc.parallel.virtual_stages > 1) {
    // The analytic model takes uneven interleaved stages (the slowest rank's ceil(layers / (pp x
    // virtual)) a chunk, as Llama 3's 126 layers on 16 ranks); train's runtime interleaves equal
    // chunks only, so the run is checked as 1F1B and predicted interleaved.
    train::TrainConfig one = tc;
    one.parallel.schedule = "1f1b", one.parallel.virtual_stages = 1;
    one.check(ranks, false);
    one.parallel.schedule = tc.parallel.schedule, one.parallel.virtual_stages = tc.parallel.virtual_stages;
    tc = one;
  } else {
    tc.check(ranks, false);
  }
  const bool mpi = predicts_mpi(plan_options.backend);
  plan::ClusterSpec cluster = cluster_file.empty() ? load_calibration(mpi, plan_options.backend == "mpi")
                                                   : plan::load_cluster(cluster_file);
  if (cluster_file.empty()) {  // this machine: every rank of the mesh runs on it
    cluster.nodes = 1;
    cluster.devices_per_node = std::max(cluster.devices_per_node, mesh::parse_mesh(tc.parallel.mesh).size());
  }
  const plan::StepEstimate r = analytic ? predict_analytic(tc, cluster) : predict_program(tc, cluster);
  const std::vector<std::pair<std::string, double>> parts = ordered_parts(r);
  if (options.logging.json) {
    nlohmann::json shares = nlohmann::json::object();
    for (const auto& [name, sec] : parts) shares[name] = sec / r.step;
    out << nlohmann::json({{"cluster", cluster.name},
                           {"backend", cluster_file.empty() ? (mpi ? "mpi" : "threads") : "cluster"},
                           {"step_time_s", r.step}, {"tokens_per_s", r.tokens_per_s},
                           {"mfu", r.mfu}, {"flops_per_rank", r.flops}, {"shares", shares}, {"by_op", r.by_op},
                           {"memory_bytes", r.memory},
                           {"instructions", instruction_count(r)},
                           {"model", analytic ? "analytic" : "programs"}})
               .dump(1)
        << "\n";
    return 0;
  }
  out << fmt::format("predicted on {}{}{}: step {:.4g} s, {:.4g} tokens/s, MFU {:.1f}% (counted FLOPs of a rank {:.4g})\n",
                     cluster.name, cluster_file.empty() && mpi ? " (MPI processes)" : "",
                     analytic ? " by the analytic model" : "", r.step, r.tokens_per_s, 100 * r.mfu, r.flops);
  for (const auto& [name, sec] : parts) out << fmt::format("  {:<24} {:>10.4g} s  {:>5.1f}%\n", name, sec, 100 * sec / r.step);
  return 0;
}

}  // namespace shardwise::cli
