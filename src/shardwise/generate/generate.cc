#include "shardwise/generate/generate.h"

#include <algorithm>

#include "shardwise/core/error.h"
#include "shardwise/generate/device_cache.h"
#include "shardwise/graph/completion.h"
#include "shardwise/graph/program.h"
#include "shardwise/mesh/shard_math.h"
#include "shardwise/pipeline/schedule.h"
#include "shardwise/pipeline/stage.h"
#include "shardwise/runtime/runtime.h"
#include "shardwise/models/model_io.h"
#include "shardwise/models/models.h"
#include "shardwise/reshard/executor.h"
#include "shardwise/tensor/device_copy.h"

namespace shardwise::train {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::vector<int64_t> coords_of(const mesh::ProcessMesh& m, int64_t process) {
  return m.coords(m.rank_index_of_process(process));
}

}  // namespace

void GenerateConfig::validate(const GptConfig& model) const {
  SW_CHECK(max_new_tokens >= 1, "--max-new-tokens must be at least 1, got {}", max_new_tokens);
  SW_CHECK(eos_id >= -1 && eos_id < model.vocab, "--eos-id {} is outside the vocabulary [0, {}) (-1: none)", eos_id,
           model.vocab);
  for (int64_t id : more_eos_ids)
    SW_CHECK(id >= 0 && id < model.vocab, "eos id {} (generation_config.json's eos_token_id) is outside the vocabulary "
             "[0, {})", id, model.vocab);
  sampling.validate();
}

std::string_view stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::Eos: return "eos";
    case StopReason::MaxNewTokens: return "max_new_tokens";
    case StopReason::MaxPositions: return "max_positions";
  }
  return "?";
}

double GenerateStats::tokens_per_second() const {
  double s = prefill_seconds + decode_seconds;
  return s > 0 ? static_cast<double>(new_tokens) / s : 0;
}

double GenerateStats::decode_tokens_per_second() const {
  return decode_seconds > 0 ? static_cast<double>(decode_tokens) / decode_seconds : 0;
}

WeightSource checkpoint_weights(const ckpt::fs::path& dir, const GptConfig& model, int64_t process, bool one_stage) {
  return [dir, model, process, one_stage](std::span<const ckpt::LoadSpec> specs) {
    return load_model_weights(dir, model, specs, process, one_stage ? std::vector<std::string>{"*"}
                                                                    : std::vector<std::string>{});
  };
}

WeightSource whole_weights(std::map<std::string, Tensor> whole, int64_t process) {
  return [whole = std::move(whole), process](std::span<const ckpt::LoadSpec> specs) {
    std::map<std::string, Tensor> out;
    for (const ckpt::LoadSpec& s : specs) {
      auto it = whole.find(s.name);
      SW_CHECK(it != whole.end(), "no weights for parameter '{}'", s.name);
      SW_CHECK(it->second.shape() == s.global_shape, "parameter '{}' is {}, the model wants {}", s.name,
               it->second.shape().to_string(), s.global_shape.to_string());
      auto block = mesh::local_block(s.global_shape, s.layout.dist, s.layout.mesh, coords_of(s.layout.mesh, process));
      out[s.name] = it->second.to(DType::F32).slice(block.offsets(), block.shape);
    }
    return out;
  };
}

Tensor logits_tensor(const GeneratedSequence& s, int64_t vocab) {
  Tensor t(DType::F32, Shape{static_cast<int64_t>(s.logits.size()), vocab});
  for (size_t k = 0; k < s.logits.size(); ++k) std::copy(s.logits[k].begin(), s.logits[k].end(), t.data<float>() + k * vocab);
  return t;
}

std::string_view positions_key(const GptConfig& model) {
  if (model.sliding_window > 0 && model.sliding_window == model.seq) return "sliding_window";
  return model.is_llama() ? "max_position_embeddings" : "n_positions";
}

void check_prompts(const std::vector<std::vector<int64_t>>& prompts, const GptConfig& model) {
  SW_CHECK(!prompts.empty(), "no prompt to generate from");
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& p = prompts[i];
    SW_CHECK(!p.empty(), "prompt {} is empty: give at least one token", i);
    SW_CHECK(static_cast<int64_t>(p.size()) <= model.seq,
             "prompt {} has {} tokens; the model holds at most {} positions ({})", i, p.size(), model.seq,
             positions_key(model));
    for (size_t t = 0; t < p.size(); ++t)
      SW_CHECK(p[t] >= 0 && p[t] < model.vocab, "prompt {}: token {} at position {} is outside the vocabulary [0, {})",
               i, p[t], t, model.vocab);
  }
}

struct Generator::Compiled {
  DecoderGraph graph;
  graph::Program program;
  std::unique_ptr<runtime::Runtime> runtime;
  reshard::Plan from_prev, to_next;  // on a pp mesh: the residual stream from the previous stage, to the next
};

// The sequences of one generate() call: the prompts, then the padding to a multiple of dp x ep.
struct Generator::Batch {
  const GenerateConfig* config = nullptr;
  int64_t prompts = 0;
  std::vector<std::vector<int64_t>> tokens;  // prompt + new tokens
  std::vector<int64_t> prompt_length, limit;  // limit: the most tokens a sequence may hold
  std::vector<bool> done;
  std::vector<StopReason> stop;
  std::vector<std::vector<std::vector<float>>> logits;  // with keep_logits: per sequence, per new token
  int64_t cache_length = 0;
  std::vector<Tensor> cache_k, cache_v;  // per layer: this rank's block [B/(dp x ep), heads/tp, C, head_dim]
  int64_t first_row = 0;                 // the sequence of the block's first row
  int64_t rows = 0;
  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
  int64_t length(size_t i) const { return static_cast<int64_t>(tokens[i].size()); }
  bool active() const { return std::find(done.begin(), done.end(), false) != done.end(); }
};

Generator::Generator(const GptConfig& model, const Strategy& strategy, std::shared_ptr<comm::Communicator> world,
                     WeightSource weights, Device device)
    : model_(model), device_(device), strategy_(strategy), world_(std::move(world)), weights_(std::move(weights)) {
  model_.param_dtype = DType::F32;
  model_.dropout = 0;
  process_ = world_->members()[static_cast<size_t>(world_->rank())];
  if (strategy.pp >= 0) cut_stages(strategy);
  strategy_.cp = -1;  // a cp dim replicates: see generate.h
}

// A pp mesh: this process's stage (its layers, embeddings on the first, the head on the last, as
// training cuts them), the stage's mesh (the other dims), the neighbouring stages' meshes, the
// world rank of the last stage's first process, and the resharder for the stream between stages.
void Generator::cut_stages(const Strategy& whole) {
  const mesh::ProcessMesh& m = whole.mesh;
  pp_ = m.dim_size(whole.pp);
  stage_ = coords_of(m, process_)[static_cast<size_t>(whole.pp)];
  const pipeline::LayerRange r = pipeline::split_layers(static_cast<int>(model_.layers), static_cast<int>(pp_))
                                     [static_cast<size_t>(stage_)];
  part_ = {r.begin, r.end, stage_ == 0, stage_ == pp_ - 1};
  auto stage = [&](int64_t s) { return pipeline::stage_mesh(m, whole.pp, s, "dp"); };
  strategy_ = Strategy::from_mesh(stage(stage_), false);
  if (stage_ > 0) prev_mesh_ = stage(stage_ - 1);
  if (stage_ < pp_ - 1) next_mesh_ = stage(stage_ + 1);
  const std::vector<int>& members = world_->members();
  const int64_t root = stage(pp_ - 1).process_ids()[0];
  last_root_ = static_cast<int>(std::find(members.begin(), members.end(), root) - members.begin());
  resharder_ = std::make_unique<reshard::Resharder>(world_->group(members));  // collective: every rank
}

void Generator::share_streams(runtime::Runtime& rt) {
  if (device_.is_host()) return;
  if (streams_of_) return rt.share_streams(*streams_of_);
  rt.use_device(device_);
  streams_of_ = &rt;
}

Generator::~Generator() = default;

Generator::Compiled& Generator::compile(std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Compiled>>& cache,
                                        std::pair<int64_t, int64_t> key, bool decode) {
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;
  auto start = Clock::now();
  auto c = std::make_unique<Compiled>();
  c->graph = decode ? build_model_decode_step(model_, strategy_, key.first, key.second, part_)
                    : build_model_prefill(model_, strategy_, key.first, key.second, part_);
  c->program = graph::lower(c->graph.g, graph::complete(c->graph.g, strategy_.mesh));
  c->runtime = std::make_unique<runtime::Runtime>(c->graph.g, c->program, world_);
  share_streams(*c->runtime);
  // The stream keeps its layout from stage to stage (the stages' meshes have one shape).
  auto between = [&](const std::string& name, const mesh::ProcessMesh& from, const mesh::ProcessMesh& to) {
    const graph::Slot& slot = c->program.slots[static_cast<size_t>(c->runtime->value_slot(name))];
    return reshard::plan_reshard(slot.meta.shape, slot.meta.dtype, {from, slot.dist}, {to, slot.dist});
  };
  if (prev_mesh_) c->from_prev = between("hidden", *prev_mesh_, strategy_.mesh);
  if (next_mesh_) c->to_next = between(c->graph.hidden, strategy_.mesh, *next_mesh_);
  for (const auto* names : {&c->graph.present_k, &c->graph.present_v})
    for (const std::string& n : *names) c->runtime->keep(n);
  if (!c->graph.hidden.empty()) c->runtime->keep(c->graph.hidden);
  for (const auto& [name, value] : c->graph.constants) bind_input(*c->runtime, name, value);
  bind_weights(*c);
  plan_seconds_ += since(start);
  return *cache.emplace(key, std::move(c)).first->second;
}

Generator::Compiled& Generator::prefill(int64_t sequences, int64_t length) {
  return compile(prefill_, {sequences, length}, false);
}

Generator::Compiled& Generator::decode_step(int64_t sequences, int64_t cache_length) {
  return compile(decode_, {sequences, cache_length}, true);
}

// Each parameter in the layout this graph reads it in; a layout not loaded before asks the source
// for every parameter of the graph (a source may insist on being asked for all of them).
void Generator::bind_weights(Compiled& c) {
  const graph::Graph& g = c.graph.g;
  const graph::Program& p = c.program;
  std::vector<ckpt::LoadSpec> specs;
  std::vector<std::string> keys;
  bool missing = false;
  for (graph::ValueId v : g.params()) {
    const graph::Slot& slot = p.slots[static_cast<size_t>(p.value_slot[static_cast<size_t>(v)])];
    specs.push_back({g.value(v).name, slot.meta.shape, DType::F32, reshard::Layout{p.mesh, slot.dist}});
    keys.push_back(g.value(v).name + "|" + slot.dist.to_string());
    missing = missing || !loaded_.count(keys.back());
  }
  if (missing) {
    std::map<std::string, Tensor> got = weights_(specs);
    for (size_t i = 0; i < specs.size(); ++i) {
      auto it = got.find(specs[i].name);
      SW_CHECK(it != got.end() && it->second.defined(), "the weights hold no '{}'", specs[i].name);
      loaded_[keys[i]] = device_.is_host() ? it->second : to_device(it->second, device_);
    }
  }
  for (size_t i = 0; i < specs.size(); ++i) c.runtime->set_local(specs[i].name, loaded_.at(keys[i]));
}

void Generator::run_prefill(Compiled& c, Batch& b) {
  const int64_t B = b.size(), T = c.graph.length;
  Tensor ids(DType::I64, Shape{B, T}), positions(DType::I64, Shape{B, T}), last(DType::F32, Shape{B, 1, T});
  for (int64_t i = 0; i < B; ++i) {
    const auto& t = b.tokens[static_cast<size_t>(i)];
    const int64_t len = std::min(b.length(static_cast<size_t>(i)), T);  // a done sequence may be longer: unread
    std::copy(t.begin(), t.begin() + len, ids.data<int64_t>() + i * T);
    for (int64_t j = 0; j < T; ++j) positions.data<int64_t>()[i * T + j] = j;
    last.data<float>()[i * T + len - 1] = 1.0f;
  }
  runtime::Runtime& rt = *c.runtime;
  if (part_.embeddings) bind_input(rt, "ids", ids);
  if (c.graph.g.find("positions") && !c.graph.constants.count("positions")) bind_input(rt, "positions", positions);  // GPT-2's [B, T]
  if (part_.head) bind_input(rt, "last", last);
  run_stage(c);
}

void Generator::bind_input(runtime::Runtime& rt, std::string_view name, const Tensor& global) const {
  if (device_.is_host()) return rt.set_global(name, global);
  const mesh::LocalBlock b = rt.local_block(name);
  rt.set_local(name, to_device(global.slice(b.offsets(), b.shape), device_, rt.stream()));
}

// This stage's turn: the stream from the previous stage, the graph, the stream to the next (on a
// device as device tensors, on the communication stream: Runtime::transfer).
void Generator::run_stage(Compiled& c) {
  runtime::Runtime& rt = *c.runtime;
  if (prev_mesh_) rt.set_local("hidden", rt.transfer(*resharder_, c.from_prev, Tensor(), device_));
  rt.run();
  if (next_mesh_) rt.transfer(*resharder_, c.to_next, rt.local(c.graph.hidden), device_);
}

// Feeds each active sequence's last token at its position (done ones: token 0 at 0, unread).
void Generator::run_decode(Compiled& c, Batch& b) {
  const int64_t B = b.size(), C = c.graph.length;
  Tensor ids(DType::I64, Shape{B, 1}), positions(DType::I64, Shape{B, 1});
  Tensor mask = Tensor::full(DType::F32, Shape{B, 1, 1, C + 1}, -1e9);
  for (int64_t i = 0; i < B; ++i) {
    const auto u = static_cast<size_t>(i);
    const int64_t p = b.done[u] ? 0 : b.length(u) - 1;
    ids.data<int64_t>()[i] = b.done[u] ? 0 : b.tokens[u].back();
    positions.data<int64_t>()[i] = p;
    float* row = mask.data<float>() + i * (C + 1);
    std::fill(row, row + p, 0.0f);  // the cached positions before it
    row[C] = 0.0f;                  // itself
  }
  runtime::Runtime& rt = *c.runtime;
  if (part_.embeddings) bind_input(rt, "ids", ids);
  if (c.graph.g.find("positions")) bind_input(rt, "positions", positions);
  bind_input(rt, "cache_mask", mask);
  run_stage(c);
}

// The prefill's keys and values fill slots [0, T) of every row; a decode step's go to the fed
// position of each active sequence of this rank's rows.
void Generator::write_cache(Compiled& c, Batch& b, bool prefill, const std::vector<int64_t>& fed_position) {
  const runtime::Runtime& rt = *c.runtime;
  for (size_t l = 0; l < b.cache_k.size(); ++l) {
    for (auto [name, cache] : {std::pair{&c.graph.present_k[l], &b.cache_k[l]}, {&c.graph.present_v[l], &b.cache_v[l]}}) {
      Tensor block = rt.local(*name);  // [rows, heads/tp, T, head_dim]
      if (block.on_device()) {  // device-to-device copies on the graph's stream
        for (int64_t r = 0; r < b.rows; ++r) {
          const auto seq = static_cast<size_t>(b.first_row + r);
          if (prefill || !b.done[seq]) paste_rows_on_device(*cache, block, r, prefill ? 0 : fed_position[seq], rt.stream());
        }
        continue;
      }
      if (prefill) {
        cache->paste(block, std::vector<int64_t>{0, 0, 0, 0});
        continue;
      }
      for (int64_t r = 0; r < b.rows; ++r) {
        const auto seq = static_cast<size_t>(b.first_row + r);
        if (b.done[seq]) continue;
        Shape row{1, block.shape()[1], 1, block.shape()[3]};
        cache->paste(block.slice(std::vector<int64_t>{r, 0, 0, 0}, row),
                     std::vector<int64_t>{r, 0, fed_position[seq], 0});
      }
    }
  }
}

// Every rank gathers the logits [B, 1, V] (the same bits everywhere; on a pp mesh the last stage's
// ranks gather them and its first process broadcasts them), so every rank chooses the same tokens
// and stops at the same step.
Tensor Generator::host_logits(Compiled& c) {
  runtime::Runtime& rt = *c.runtime;
  if (device_.is_host()) return rt.gather(c.graph.logits);
  // On a device: this rank's block when it is the whole (no reshard), then one copy to the host.
  const graph::Program& p = c.program;
  const graph::Slot& slot = p.slots[static_cast<size_t>(p.value_slot[static_cast<size_t>(c.graph.g.get(c.graph.logits))])];
  const Tensor logits = slot.dist.is_replicated() ? rt.local(c.graph.logits) : rt.gather(c.graph.logits);
  return to_host(logits, rt.stream());
}

void Generator::next_tokens(Compiled& c, Batch& b) {
  const int64_t V = model_.vocab;
  Tensor logits = part_.head ? host_logits(c) : Tensor(DType::F32, Shape{b.size(), 1, V});
  if (pp_ > 1) world_->broadcast(logits.raw(), logits.numel(), DType::F32, last_root_);
  const GenerateConfig& config = *b.config;
  for (size_t i = 0; i < b.tokens.size(); ++i) {
    if (b.done[i]) continue;
    std::span<const float> row(logits.data<float>() + static_cast<int64_t>(i) * V, static_cast<size_t>(V));
    const int64_t position = b.length(i);
    const auto usable = config.usable_vocab > 0 ? std::min(row.size(), static_cast<size_t>(config.usable_vocab)) : row.size();
    const int64_t token = choose_token(row.first(usable), config.sampling, static_cast<int64_t>(i), position);
    b.tokens[i].push_back(token);
    if (config.keep_logits) b.logits[i].emplace_back(row.begin(), row.end());
    const int64_t produced = b.length(i) - b.prompt_length[i];
    if (static_cast<int64_t>(i) >= b.prompts) b.done[i] = true;  // dp padding: one token is enough
    else if (token == config.eos_id || std::ranges::count(config.more_eos_ids, token) > 0)
      b.done[i] = true, b.stop[i] = StopReason::Eos;
    else if (produced == config.max_new_tokens) b.done[i] = true, b.stop[i] = StopReason::MaxNewTokens;
    else if (b.length(i) == b.limit[i]) b.done[i] = true, b.stop[i] = StopReason::MaxPositions;
  }
}

GenerateResult Generator::generate(const std::vector<std::vector<int64_t>>& prompts, const GenerateConfig& config) {
  config.validate(model_);
  check_prompts(prompts, model_);
  const int64_t n = static_cast<int64_t>(prompts.size()), ways = strategy_.data_size();  // dp x ep
  Batch b;
  b.config = &config;
  b.prompts = n;
  const int64_t B = (n + ways - 1) / ways * ways;
  int64_t longest = 0, cache_length = 0;
  for (int64_t i = 0; i < B; ++i) {
    const auto& p = prompts[static_cast<size_t>(i < n ? i : 0)];
    const auto len = static_cast<int64_t>(p.size());
    b.tokens.push_back(p);
    b.prompt_length.push_back(len);
    b.limit.push_back(i < n ? std::min(len + config.max_new_tokens, model_.seq + 1) : len + 1);
    longest = std::max(longest, len);
    cache_length = std::max(cache_length, b.limit.back() - 1);  // the last token is never fed
  }
  b.done.assign(static_cast<size_t>(B), false);
  b.stop.assign(static_cast<size_t>(B), StopReason::MaxNewTokens);
  b.logits.assign(static_cast<size_t>(B), {});
  b.cache_length = cache_length = std::max(cache_length, longest);
  GenerateResult result;
  GenerateStats& stats = result.stats;
  const double plan_before = plan_seconds_;
  if (config.kv_cache) {
    Compiled& pre = prefill(B, longest);
    Compiled& step = decode_step(B, cache_length);
    // This rank's block of the cache: the layout the decode graph reads it in.
    const graph::Program& p = step.program;
    const auto coords = coords_of(p.mesh, process_);
    for (size_t l = 0; l < step.graph.past_k.size(); ++l) {
      for (auto [name, into] : {std::pair{&step.graph.past_k[l], &b.cache_k}, {&step.graph.past_v[l], &b.cache_v}}) {
        const graph::Slot& slot = p.slots[static_cast<size_t>(p.value_slot[static_cast<size_t>(step.graph.g.get(*name))])];
        mesh::LocalBlock block = mesh::local_block(slot.meta.shape, slot.dist, p.mesh, coords);
        // On a device, zeroed on the compute stream that writes and reads it (not the default stream).
        into->push_back(device_.is_host() ? Tensor(DType::F32, block.shape)
                                          : zeros_on(DType::F32, block.shape, device_, step.runtime->stream()));
        step.runtime->set_local(*name, into->back());  // shared storage: written in place below
        b.first_row = block.offset[0], b.rows = block.shape[0];
      }
    }
    auto start = Clock::now();
    run_prefill(pre, b);
    write_cache(pre, b, true, {});
    next_tokens(pre, b);
    stats.prefill_seconds = since(start);
    stats.steps = 1;
    start = Clock::now();
    while (b.active()) {
      std::vector<int64_t> fed(static_cast<size_t>(B));
      for (size_t i = 0; i < fed.size(); ++i) fed[i] = b.length(i) - 1;
      run_decode(step, b);
      write_cache(step, b, false, fed);
      next_tokens(step, b);
      ++stats.steps;
    }
    stats.decode_seconds = since(start);
  } else {
    // Recomputation: each step runs the prefill graph over every token so far (planned once per
    // length; planning is not counted in the step's time).
    while (b.active()) {
      auto start = Clock::now();
      const double planned = plan_seconds_;
      int64_t length = 0;
      for (size_t i = 0; i < b.tokens.size(); ++i) length = b.done[i] ? length : std::max(length, b.length(i));
      Compiled& c = prefill(B, length);
      run_prefill(c, b);
      next_tokens(c, b);
      (stats.steps == 0 ? stats.prefill_seconds : stats.decode_seconds) += since(start) - (plan_seconds_ - planned);
      ++stats.steps;
    }
  }
  stats.plan_seconds = plan_seconds_ - plan_before;
  for (int64_t i = 0; i < n; ++i) {
    const auto u = static_cast<size_t>(i);
    GeneratedSequence s;
    s.tokens.assign(b.tokens[u].begin() + b.prompt_length[u], b.tokens[u].end());
    s.stop = b.stop[u];
    s.logits = std::move(b.logits[u]);
    stats.new_tokens += static_cast<int64_t>(s.tokens.size());
    stats.decode_tokens += static_cast<int64_t>(s.tokens.size()) - 1;
    result.sequences.push_back(std::move(s));
  }
  return result;
}

}  // namespace shardwise::train
