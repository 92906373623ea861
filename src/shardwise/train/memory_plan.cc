#include "shardwise/train/memory_plan.h"

#include <unistd.h>

#include <algorithm>
#include <deque>
#include <fstream>
#include <map>
#include <set>

#include "shardwise/core/error.h"
#include "shardwise/graph/prefetch.h"
#include "shardwise/mesh/shard_math.h"
#include "shardwise/ops/op.h"
#include "shardwise/pipeline/stage.h"
#include "shardwise/train/grad_buckets.h"
#include "shardwise/models/models.h"
#include "shardwise/core/plural.h"

namespace shardwise::train {

std::string human_bytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024));
  if (b >= 1024.0) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{} B", bytes);
}

namespace {

std::string human(int64_t bytes) { return human_bytes(bytes); }

// One compiled stage with the runtime's buffer lifetimes (runtime::Runtime's rules, with the
// runner's keep / free_after_use / drop calls), replayed per rank over the slots' block sizes.
struct StageModel {
  pipeline::StageSpec spec;
  pipeline::CompiledStage compiled;
  std::vector<int> last_use;  // per slot: the last position in the order whose value it is read at
  std::vector<bool> kept;     // per slot: never freed by the runtime
  std::vector<bool> shared;   // per slot: a parameter or constant (bound once, in every frame)
  std::vector<bool> gathered;  // per slot: a parameter's copy in another distribution (stage 3's all-gathers)
  std::vector<int> per_batch;  // slots bound per micro-batch before its forward (input, feeds)
  std::vector<bool> grad;      // per slot: a parameter's gradient
  int output = -1, output_grad = -1, input = -1, input_grad = -1;
  int prefetch = 0;  // stage 3's --prefetch-params: gathers started ahead (graph/prefetch.h)
};

bool reads_value(const graph::Graph& g, const graph::Instr& ins, size_t k, bool release) {
  if (!release || ins.kind != graph::InstrKind::Backward) return true;
  const graph::Node& n = g.node(ins.node);
  const size_t forward_tensors = g.node(n.forward).inputs.size() + g.node(n.forward).outputs.size();
  return k >= forward_tensors || ops::op_registry().get(n.op).backward_reads_value(static_cast<int>(k), n.attrs);
}

StageModel model_stage(pipeline::StageSpec spec, const mesh::ProcessMesh& mesh, bool split, bool release,
                       int prefetch) {
  StageModel m;
  m.prefetch = spec.shard_params_dims.empty() ? 0 : prefetch;
  m.compiled = pipeline::compile_stage(spec, mesh, split);
  m.spec = std::move(spec);
  const graph::Graph& g = *m.spec.graph;
  const graph::Program& p = m.compiled.program;
  const size_t n = p.slots.size();
  m.last_use.assign(n, -1);
  m.kept.assign(n, false);
  m.shared.assign(n, false);
  std::vector<bool> read(n, false);
  for (size_t pos = 0; pos < m.compiled.order.size(); ++pos) {
    const graph::Instr& ins = p.instrs[static_cast<size_t>(m.compiled.order[pos])];
    for (size_t k = 0; k < ins.in.size(); ++k) {
      const int s = ins.in[k];
      if (s < 0) continue;
      read[static_cast<size_t>(s)] = true;
      if (reads_value(g, ins, k, release)) m.last_use[static_cast<size_t>(s)] = static_cast<int>(pos);
    }
  }
  for (const graph::Value& v : g.values()) {
    const int s = p.value_slot[static_cast<size_t>(v.id)];
    if (s < 0) continue;
    const bool recomputed = v.recompute_copy >= 0 || (v.producer >= 0 && g.node(v.producer).recomputes >= 0);
    if (v.producer < 0 || (!read[static_cast<size_t>(s)] && !recomputed)) m.kept[static_cast<size_t>(s)] = true;
  }
  m.grad.assign(n, false);
  for (int s : p.param_grad_slot)
    if (s >= 0) m.kept[static_cast<size_t>(s)] = m.grad[static_cast<size_t>(s)] = true;
  auto slot = [&](const std::string& name) { return p.value_slot[static_cast<size_t>(g.get(name))]; };
  for (graph::ValueId v : g.params()) m.shared[static_cast<size_t>(p.value_slot[static_cast<size_t>(v)])] = true;
  m.gathered.assign(n, false);
  for (size_t s = 0; s < n; ++s) {
    const graph::ValueId v = p.slots[s].value;
    m.gathered[s] = v >= 0 && g.value(v).kind == graph::ValueKind::Param &&
                    p.value_slot[static_cast<size_t>(v)] != static_cast<int>(s);
  }
  for (graph::ValueId v : g.frozen_params()) m.shared[static_cast<size_t>(p.value_slot[static_cast<size_t>(v)])] = true;
  for (const std::string& c : m.spec.constants) m.shared[static_cast<size_t>(slot(c))] = true;
  for (const std::string& f : m.spec.feeds) {
    m.kept[static_cast<size_t>(slot(f))] = false;
    m.per_batch.push_back(slot(f));
  }
  if (!m.spec.input.empty()) {
    m.input = slot(m.spec.input);
    m.kept[static_cast<size_t>(m.input)] = false;
    m.per_batch.push_back(m.input);
    m.input_grad = slot(m.compiled.input_grad);
  }
  if (!m.spec.output.empty()) {
    m.output = slot(m.spec.output);
    m.kept[static_cast<size_t>(m.output)] = true;
    m.output_grad = slot(m.spec.output_grad);
    m.kept[static_cast<size_t>(m.output_grad)] = false;
  }
  if (!m.spec.loss.empty()) m.kept[static_cast<size_t>(slot(m.spec.loss))] = true;
  return m;
}

// GradBuckets' bytes replayed (grad_buckets.cc, the same steps): the sums handed over, each closed
// bucket packed (its sums, then the packed copy and this rank's received ranges), the oldest of
// `max_in_flight` waited for (its ranges copied out, its buffers freed).
class BucketSim {
 public:
  // Per parameter: its f32 sum's bytes, this rank's range of it (bytes) and its data group (one
  // bucket open per group).
  BucketSim(int64_t bucket_bytes, int max_in_flight, std::vector<int64_t> sum_bytes, std::vector<int64_t> range_bytes,
            std::vector<int> group_of)
      : bucket_bytes_(bucket_bytes), max_in_flight_(max_in_flight), sum_(std::move(sum_bytes)),
        range_(std::move(range_bytes)), group_(std::move(group_of)) {
    for (int g : group_) open_.resize(std::max(open_.size(), static_cast<size_t>(g) + 1));
  }
  // Hands parameter p's sum over; returns the most bytes held meanwhile.
  int64_t ready(size_t p) {
    call_peak_ = held_;
    hold(sum_[p]);
    auto& [bytes, range] = open_[static_cast<size_t>(group_[p])];
    bytes += sum_[p];
    range += range_[p];
    if (bytes >= bucket_bytes_) close(static_cast<size_t>(group_[p]));
    return call_peak_;
  }
  int64_t finish() {  // closes the open buckets, waits for all; the most bytes held meanwhile
    call_peak_ = held_;
    for (size_t g = 0; g < open_.size(); ++g) close(g);
    while (!flight_.empty()) wait_oldest();
    return call_peak_;
  }
  int64_t held() const { return held_; }
  int64_t peak() const { return peak_; }

 private:
  void hold(int64_t b) {
    held_ += b;
    peak_ = std::max(peak_, held_);
    call_peak_ = std::max(call_peak_, held_);
  }
  void close(size_t g) {
    auto& [bytes, range] = open_[g];
    if (bytes == 0) return;
    while (flight_.size() >= static_cast<size_t>(max_in_flight_)) wait_oldest();
    hold(bytes);   // the packed copy
    hold(-bytes);  // the sums go
    hold(range);   // the received ranges
    flight_.push_back({bytes, range});
    bytes = range = 0;
  }
  void wait_oldest() {
    const auto [bytes, range] = flight_.front();
    flight_.pop_front();
    hold(range);            // the ranges copied out (the results)
    hold(-bytes - range);  // the bucket's buffers go
  }
  int64_t bucket_bytes_;
  int max_in_flight_;
  std::vector<int64_t> sum_, range_;
  std::vector<int> group_;
  std::vector<std::pair<int64_t, int64_t>> open_;  // per group: the open bucket's sums and ranges
  std::deque<std::pair<int64_t, int64_t>> flight_;
  int64_t held_ = 0, peak_ = 0, call_peak_ = 0;
};

// The buffers of one micro-batch on one rank (slot -> bytes), run through positions of the order.
class Frame {
 public:
  Frame(const StageModel& m, const std::vector<int64_t>& bytes) : m_(m), bytes_(bytes) {}
  // The gradients handed to `buckets` as computed (PipelineRunner::hand_over): after its instruction
  // each leaves the frame for the buckets, whose bytes count with the frame's.
  void hand_to(BucketSim* buckets) { buckets_ = buckets; }
  void bind(int slot) { live_.insert(slot); }
  void drop(int slot) { live_.erase(slot); }
  // Runs [begin, end); returns the most bytes held at once (after an instruction's outputs, before its frees).
  int64_t run(size_t begin, size_t end) {
    const graph::Program& p = m_.compiled.program;
    int64_t peak = held() + (buckets_ ? buckets_->held() : 0);
    gathered_peak_ = std::max(gathered_peak_, held(true));
    // Stage 3's prefetch: a started gather's copy is held from its start (runtime::Runtime::run).
    const std::vector<std::vector<size_t>> starts =
        graph::prefetch_starts(*m_.spec.graph, p, m_.compiled.order, begin, end, m_.prefetch);
    for (size_t pos = begin; pos < end; ++pos) {
      const graph::Instr& ins = p.instrs[static_cast<size_t>(m_.compiled.order[pos])];
      if (!starts[pos].empty()) {
        for (size_t q : starts[pos]) live_.insert(p.instrs[static_cast<size_t>(m_.compiled.order[q])].out[0]);
        peak = std::max(peak, held() + (buckets_ ? buckets_->held() : 0));
        gathered_peak_ = std::max(gathered_peak_, held(true));
      }
      for (int s : ins.out)
        if (s >= 0) live_.insert(s);
      peak = std::max(peak, held() + (buckets_ ? buckets_->held() : 0));
      gathered_peak_ = std::max(gathered_peak_, held(true));
      for (int s : ins.in)
        if (s >= 0 && m_.last_use[static_cast<size_t>(s)] == static_cast<int>(pos) && !m_.kept[static_cast<size_t>(s)])
          live_.erase(s);
      for (int s : ins.out)
        if (s >= 0 && m_.last_use[static_cast<size_t>(s)] < 0 && !m_.kept[static_cast<size_t>(s)]) live_.erase(s);
      if (buckets_) {  // in parameter order, as the runner hands them over
        std::vector<size_t> handed;
        for (int s : ins.out)
          if (s >= 0 && m_.grad[static_cast<size_t>(s)]) handed.push_back(grad_param(s));
        std::sort(handed.begin(), handed.end());
        for (size_t i : handed) {
          live_.erase(m_.compiled.program.param_grad_slot[i]);
          peak = std::max(peak, held() + buckets_->ready(i));
        }
      }
    }
    return peak;
  }
  // The frame's bytes (parameters and constants are shared, not counted), or of them the gathered
  // parameter copies'.
  int64_t held(bool gathered_only = false) const {
    int64_t b = 0;
    for (int s : live_)
      if (!m_.shared[static_cast<size_t>(s)] && (!gathered_only || m_.gathered[static_cast<size_t>(s)]))
        b += bytes_[static_cast<size_t>(s)];
    return b;
  }
  int64_t gathered_peak() const { return gathered_peak_; }  // the most held(true) seen by run()
  // The tensors held now (after a forward: what the frame keeps for the backward) and the first
  // instruction after the forward that reads each.
  std::vector<KeptTensor> kept(int stage) const {
    const graph::Program& p = m_.compiled.program;
    const graph::Graph& g = *m_.spec.graph;
    std::vector<KeptTensor> out;
    for (int s : live_) {
      if (m_.shared[static_cast<size_t>(s)]) continue;
      KeptTensor k{p.slots[static_cast<size_t>(s)].name, bytes_[static_cast<size_t>(s)], "", stage};
      for (size_t pos = m_.compiled.forward_end; pos < m_.compiled.order.size() && k.read_by.empty(); ++pos) {
        const graph::Instr& ins = p.instrs[static_cast<size_t>(m_.compiled.order[pos])];
        if (std::find(ins.in.begin(), ins.in.end(), s) == ins.in.end()) continue;
        if (ins.kind == graph::InstrKind::Reshard) k.read_by = "reshard";
        else if (ins.kind == graph::InstrKind::Backward) k.read_by = g.node(ins.node).op + " backward";
        else k.read_by = g.node(ins.node).op + (ins.kind == graph::InstrKind::Kernel ? " recomputed" : "");
      }
      out.push_back(std::move(k));
    }
    return out;
  }

 private:
  const StageModel& m_;
  const std::vector<int64_t>& bytes_;
  std::set<int> live_;
  int64_t gathered_peak_ = 0;
  BucketSim* buckets_ = nullptr;
  size_t grad_param(int slot) const {
    const std::vector<int>& g = m_.compiled.program.param_grad_slot;
    return static_cast<size_t>(std::find(g.begin(), g.end(), slot) - g.begin());
  }
};

// Per local stage of one rank: the frame after a forward, after an input gradient, and the most
// bytes a forward / backward / input-gradient / weight-gradient action holds while it runs.
struct StageBytes {
  int64_t frame = 0, weight_frame = 0;
  int64_t forward_peak = 0, backward_peak = 0, input_peak = 0, weight_peak = 0;
  int64_t gathered = 0;  // the most bytes of gathered parameter copies in any of them
};

StageBytes stage_bytes(const StageModel& m, const std::vector<int64_t>& bytes, bool release,
                       BucketSim* buckets = nullptr, std::vector<KeptTensor>* kept = nullptr) {
  StageBytes out;
  const size_t fe = m.compiled.forward_end, ie = m.compiled.input_grad_end, end = m.compiled.order.size();
  Frame f(m, bytes);
  for (int s : m.per_batch) f.bind(s);
  out.forward_peak = f.run(0, fe);
  if (m.output >= 0 && release) f.drop(m.output);
  out.frame = f.held();
  if (kept) {
    std::vector<KeptTensor> k = f.kept(m.spec.stage);
    kept->insert(kept->end(), k.begin(), k.end());
  }
  Frame whole = f;  // the whole backward
  if (m.output_grad >= 0) whole.bind(m.output_grad);
  whole.hand_to(buckets);
  out.backward_peak = whole.run(fe, end);
  Frame input = f;  // split: the input gradient, then the weight gradient
  if (m.output_grad >= 0) input.bind(m.output_grad);
  out.input_peak = input.run(fe, ie);
  if (m.input_grad >= 0) input.drop(m.input_grad);
  out.weight_frame = input.held();
  out.weight_peak = input.run(ie, end);
  out.gathered = std::max(whole.gathered_peak(), input.gathered_peak());
  return out;
}

int64_t block_bytes(const graph::Slot& s, const mesh::ProcessMesh& mesh, const std::vector<int64_t>& coords,
                    DType dtype) {
  return mesh::local_shape(s.meta.shape, s.dist, mesh, coords).numel() * static_cast<int64_t>(dtype_size(dtype));
}

}  // namespace

int64_t MemoryPlan::per_process() const {
  int64_t total = 0;
  for (const RankMemory& r : ranks) total = threads ? total + r.peak() * ranks_each : std::max(total, r.peak());
  return total;
}

const RankMemory& MemoryPlan::largest() const {
  return *std::max_element(ranks.begin(), ranks.end(),
                           [](const RankMemory& a, const RankMemory& b) { return a.peak() < b.peak(); });
}

std::string MemoryPlan::table() const {
  std::string out = fmt::format("memory plan: {}\n", description);
  out += fmt::format("{:>4} {:>3} {:>11} {:>11} {:>11} {:>11} {:>11} {:>5} {:>11} {:>11} {:>11}\n", "rank", "pp",
                     "params", "grads", "optimizer", "masters", "activations", "mbs", "working", "comm", "peak");
  for (const RankMemory& r : ranks) {
    out += fmt::format("{:>4} {:>3} {:>11} {:>11} {:>11} {:>11} {:>11} {:>5} {:>11} {:>11} {:>11}\n", r.rank,
                       r.pipeline_rank, human(r.params),
                       r.grad_shards ? fmt::format("{}*", human(r.grads)) : human(r.grads), human(r.optimizer),
                       human(r.masters), human(r.activations), r.in_flight, human(r.working), human(r.comm),
                       human(r.peak()));
  }
  if (!ranks.empty() && ranks.front().grads_bucketed)
    out += "  * stage 2, reduced during the backward: the most the gradient buckets hold (sums, packed copies, ranges), inside working\n";
  else if (!ranks.empty() && ranks.front().grad_shards)
    out += "  * stage 2: the full f32 sums until the reduce-scatter; the shards kept after it are in --json (grad_shards)\n";
  if (const RankMemory& l = largest(); l.gathered > 0)
    out += fmt::format("  stage 3: params are each rank's dp shards; working includes up to {} of all-gathered parameter "
                       "copies (rank {})\n",
                       human(l.gathered), l.rank);
  if (symmetric)
    out += fmt::format("  the first rank of each pipeline rank only (--symmetric): each stands for the {} ranks of its pipeline rank\n",
                       ranks_each);
  out += fmt::format("per process ({}): {}\n", threads ? "threads: every rank in one process" : "MPI: one rank a process",
                     human(per_process()));
  return out;
}

std::string MemoryPlan::kept_table(int top) const {
  std::string out;
  for (const RankMemory& r : ranks) {
    if (r.kept.empty()) continue;
    std::map<int, std::vector<const KeptTensor*>> by_stage;
    for (const KeptTensor& k : r.kept) by_stage[k.stage].push_back(&k);
    for (auto& [stage, kept] : by_stage) {
      std::stable_sort(kept.begin(), kept.end(), [](const KeptTensor* a, const KeptTensor* b) { return a->bytes > b->bytes; });
      int64_t total = 0;
      for (const KeptTensor* k : kept) total += k->bytes;
      out += fmt::format("rank {} stage {}: a micro-batch keeps {} in {} tensors for its backward{}\n", r.rank, stage,
                         human(total), kept.size(), kept.size() > static_cast<size_t>(top) ? fmt::format(", the {} largest:", top) : ":");
      int64_t shown = 0;
      for (size_t i = 0; i < kept.size() && i < static_cast<size_t>(top); ++i) {
        out += fmt::format("  {:>11}  {}  <- {}\n", human(kept[i]->bytes), kept[i]->name,
                           kept[i]->read_by.empty() ? "kept to the end of the step" : kept[i]->read_by);
        shown += kept[i]->bytes;
      }
      if (kept.size() > static_cast<size_t>(top))
        out += fmt::format("  {:>11}  the other {}\n", human(total - shown), kept.size() - static_cast<size_t>(top));
    }
  }
  return out;
}

nlohmann::json MemoryPlan::to_json() const {
  nlohmann::json rows = nlohmann::json::array();
  for (const RankMemory& r : ranks) {
    rows.push_back({{"rank", r.rank}, {"pipeline_rank", r.pipeline_rank}, {"params", r.params}, {"grads", r.grads},
                    {"grad_shards", r.grad_shards}, {"optimizer", r.optimizer}, {"masters", r.masters},
                    {"activations", r.activations}, {"micro_batches_in_flight", r.in_flight},
                    {"working", r.working}, {"gathered_params", r.gathered}, {"comm", r.comm}, {"peak", r.peak()}});
    if (r.kept.empty()) continue;
    nlohmann::json kept = nlohmann::json::array();
    for (const KeptTensor& k : r.kept)
      kept.push_back({{"name", k.name}, {"bytes", k.bytes}, {"read_by", k.read_by}, {"stage", k.stage}});
    rows.back()["kept"] = kept;
  }
  nlohmann::json j = {{"description", description}, {"threads", threads}, {"per_process", per_process()}, {"ranks", rows}};
  if (symmetric) j["ranks_each"] = ranks_each;
  return j;
}

MemoryPlan plan_memory(const TrainConfig& c, bool threads, bool symmetric, bool list_kept) {
  const Strategy strategy = Strategy::from_mesh(mesh::parse_mesh(c.parallel.mesh), c.parallel.sequence_parallel);
  const GptConfig model = kernel_model(c);
  const PipelineConfig pc = pipeline_config(c);
  const StageLayout layout = stage_layout(model, strategy, pc, static_cast<int>(c.optimizer.accumulation));
  const pipeline::Schedule& schedule = layout.schedule;
  MemoryPlan plan;
  plan.threads = threads;
  plan.symmetric = symmetric;
  plan.description = fmt::format(
      "{}{}; mesh {}; micro-batch {} x {}; sharding stage {}{}; recompute {}{}{}",
      describe_model(c.model, false), c.bf16 ? ", bf16" : "", strategy.mesh.to_string(),
      c.optimizer.micro_batch, counted(c.optimizer.accumulation, "micro-batch"), c.parallel.sharding.stage, c.parallel.sharding.shards_optimizer() ? " " + c.parallel.sharding.layout : "",
      c.model.recompute, c.model.recompute_layers >= 0 ? fmt::format(" (first {})", counted(c.model.recompute_layers, "layer")) : "",
      strategy.pp >= 0 ? fmt::format("; schedule {}", schedule.name) : "");
  std::map<int, std::vector<StageModel>> compiled;  // per pipeline rank: its stages
  const int64_t pp = strategy.pp < 0 ? 1 : strategy.mesh.dim_size(strategy.pp);
  for (int r = 0; r < pp; ++r) {
    for (pipeline::StageSpec& spec : stage_specs(model, layout, pc, c.optimizer.micro_batch * strategy.data_size(), r,
                                                 StageGraph::Training)) {
      const mesh::ProcessMesh& mesh = layout.meshes[static_cast<size_t>(spec.stage)];
      compiled[r].push_back(model_stage(std::move(spec), mesh, schedule.split_backward, pc.release, pc.prefetch_params));
    }
  }
  // Stage 2 with the buckets started during the backward, one micro-batch, no pp: each gradient is
  // handed to the buckets once computed and its buffer freed (PipelineRunner::hand_over), so the
  // runtime's working bytes lose the gradients and `grads` is what the buckets hold at most.
  const bool early_free = c.parallel.sharding.stage == 2 && c.parallel.overlap_grad_reduce == "on" && schedule.micro_batches == 1 &&
                          strategy.pp < 0 && layout.stage_strategy.data_size() > 1;
  if (symmetric) plan.ranks_each = strategy.mesh.size() / pp;
  std::set<int> planned;  // symmetric: the pipeline ranks whose first rank is planned
  for (int64_t process = 0; process < strategy.mesh.size(); ++process) {
    RankMemory rm;
    rm.rank = process;
    const auto world_coords = strategy.mesh.coords(strategy.mesh.rank_index_of_process(process));
    rm.pipeline_rank = strategy.pp < 0 ? 0 : static_cast<int>(world_coords[static_cast<size_t>(strategy.pp)]);
    if (symmetric && !planned.insert(rm.pipeline_rank).second) continue;
    std::map<int, StageBytes> stages;
    std::vector<int64_t> numels;  // per trained parameter (params() order, each once)
    std::vector<std::vector<int>> data_dims;  // per trained parameter: its data group's dims (sharding.h)
    std::map<std::vector<int>, std::pair<int, int>> groups;  // dims -> size, this rank's index (data_groups' order)
    std::set<std::string> seen;
    const StageModel* only = nullptr;  // early_free: the rank's one stage, and its slots' bytes
    std::vector<int64_t> only_bytes;
    for (const StageModel& m : compiled[rm.pipeline_rank]) {
      const mesh::ProcessMesh& mesh = layout.meshes[static_cast<size_t>(m.spec.stage)];
      const auto coords = mesh.coords(mesh.rank_index_of_process(process));
      const graph::Graph& g = *m.spec.graph;
      const graph::Program& p = m.compiled.program;
      std::vector<int64_t> bytes;
      for (const graph::Slot& s : p.slots) bytes.push_back(block_bytes(s, mesh, coords, s.meta.dtype));
      stages[m.spec.stage] = stage_bytes(m, bytes, pc.release, nullptr, list_kept ? &rm.kept : nullptr);
      if (early_free) only = &m, only_bytes = bytes;
      rm.gathered = std::max(rm.gathered, stages[m.spec.stage].gathered);
      for (bool trained : {true, false}) {
        for (graph::ValueId v : trained ? g.params() : g.frozen_params()) {
          const graph::Slot& s = p.slots[static_cast<size_t>(p.value_slot[static_cast<size_t>(v)])];
          if (trained) rm.grads += block_bytes(s, mesh, coords, DType::F32);  // the runner's f32 sums, per stage
          if (!seen.insert(g.value(v).name).second) continue;
          rm.params += block_bytes(s, mesh, coords, model.param_dtype);
          if (!trained) continue;
          numels.push_back(mesh::local_shape(s.meta.shape, s.dist, mesh, coords).numel());
          data_dims.push_back(data_group_dims(s.dist, layout.stage_strategy.data_dims()));
          const auto [it, added] = groups.emplace(data_dims.back(), std::pair{0, 0});
          if (added) {  // as StagedGpt::data_groups orders the group's members
            const std::vector<int64_t> members = mesh.processes_along(process, it->first);
            it->second = {static_cast<int>(members.size()),
                          static_cast<int>(std::find(members.begin(), members.end(), process) - members.begin())};
          }
        }
      }
      if (m.input >= 0) rm.comm += bytes[static_cast<size_t>(m.input)] + bytes[static_cast<size_t>(m.input_grad)];
      if (m.output >= 0) rm.comm += bytes[static_cast<size_t>(m.output)] + bytes[static_cast<size_t>(m.output_grad)];
    }
    // Each parameter's state over its data group (StagedGpt::data_groups): dense dp x ep, experts dp.
    std::vector<int> group_of, group_sizes, group_ranks;
    for (const auto& [dims, size_rank] : groups) group_sizes.push_back(size_rank.first), group_ranks.push_back(size_rank.second);
    for (const std::vector<int>& dims : data_dims)
      group_of.push_back(static_cast<int>(std::distance(groups.begin(), groups.find(dims))));
    const ShardPlan shards = plan_shards(c.parallel.sharding.layout, numels, group_of, group_sizes, group_ranks);
    int64_t state_elements = 0;
    for (int64_t n : numels) state_elements += n;
    if (c.parallel.sharding.shards_optimizer()) state_elements = shards.owned_elements();  // stage 3: the blocks are the shards
    rm.optimizer = 8 * state_elements;
    rm.grads_in_working = schedule.micro_batches == 1 && !c.bf16;
    rm.masters = c.bf16 ? 4 * state_elements : 0;
    if (c.parallel.sharding.stage == 2) rm.grad_shards = 4 * state_elements;
    int64_t finish_peak = 0;
    if (c.parallel.sharding.stage == 1 || c.parallel.sharding.stage == 2) {
      // ShardedOptimizer::reduce after the backward: every gradient sum is still held while the
      // rank's range of each is copied out (stage 1) or reduce-scattered into a fresh range (stage 2,
      // the sums freed one by one), so the sums and the ranges are alive together.
      finish_peak = (rm.grads_in_working ? rm.grads : 0) + 4 * state_elements;
    }
    if (early_free) {  // the backward again, each gradient handed to the buckets' replay once computed
      std::vector<int64_t> sums, ranges;
      for (size_t i = 0; i < numels.size(); ++i) {
        sums.push_back(4 * numels[i]);
        ranges.push_back(4 * shards.count(i));
      }
      BucketSim buckets(static_cast<int64_t>(c.parallel.grad_bucket_mb * (1 << 20)), BucketOptions{}.max_in_flight, sums, ranges,
                        group_of);
      stages.at(only->spec.stage).backward_peak = stage_bytes(*only, only_bytes, pc.release, &buckets).backward_peak;
      finish_peak = buckets.finish();  // Trainer::reduce_grads, after the runtime let the frame go
      rm.grads = buckets.peak();       // inside `working` (the backward's peak counts them)
      rm.grads_in_working = rm.grads_bucketed = true;
    }
    // The schedule's actions: frames in flight after each, and the bytes while each compute runs.
    std::map<std::pair<int, int>, int64_t> frames;
    int64_t held = 0;
    for (const pipeline::Action& a : schedule.actions[static_cast<size_t>(rm.pipeline_rank)]) {
      if (!pipeline::is_compute(a.kind)) continue;
      const StageBytes& sb = stages.at(a.stage);
      const std::pair<int, int> key{a.stage, a.micro_batch};
      const int64_t mine = frames.contains(key) ? frames[key] : 0, others = held - mine;
      switch (a.kind) {
        case pipeline::ActionKind::Forward: rm.working = std::max(rm.working, others + sb.forward_peak); frames[key] = sb.frame; break;
        case pipeline::ActionKind::Backward: rm.working = std::max(rm.working, others + sb.backward_peak); frames.erase(key); break;
        case pipeline::ActionKind::BackwardInput: rm.working = std::max(rm.working, others + sb.input_peak); frames[key] = sb.weight_frame; break;
        default: rm.working = std::max(rm.working, others + sb.weight_peak); frames.erase(key); break;
      }
      held = 0;
      for (const auto& [k, b] : frames) held += b;
      rm.activations = std::max(rm.activations, held);
      rm.in_flight = std::max(rm.in_flight, static_cast<int>(frames.size()));
    }
    rm.working = std::max({rm.working, rm.activations, finish_peak});
    plan.ranks.push_back(rm);
  }
  return plan;
}

int64_t available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace shardwise::train
