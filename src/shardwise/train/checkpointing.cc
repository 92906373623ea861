#include "shardwise/train/checkpointing.h"

#include <fnmatch.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <set>

#include "shardwise/ckpt/checksum.h"
#include "shardwise/tensor/current_stream.h"
#include "shardwise/ckpt/group_reader.h"
#include "shardwise/comm/objects.h"
#include "shardwise/core/error.h"
#include "shardwise/models/model_io.h"
#include "shardwise/data/tokenizer.h"
#include "shardwise/train/run_options.h"
#include "shardwise/train/vocab_resize.h"

namespace shardwise::train {
namespace {

// The ids config.json and generation_config.json name: a --tokenizer run's (its bos, eos and pad;
// eos for a missing bos or pad), else the run's --eos-id for all three, else the vocabulary's default.
SpecialTokens special_tokens(const TrainConfig& c) {
  if (!c.data.tokenizer.empty()) {
    const Tokenizer t(c.data.tokenizer);
    const int64_t eos = c.data.eos_id >= 0 ? c.data.eos_id : t.eos_id() >= 0 ? t.eos_id() : default_special_tokens(c.model.vocab).eos;
    return {t.bos_id() >= 0 ? t.bos_id() : eos, eos, t.pad_id() >= 0 ? t.pad_id() : eos};
  }
  if (c.data.eos_id >= 0) return {c.data.eos_id, c.data.eos_id, c.data.eos_id};
  return default_special_tokens(c.model.vocab);
}

// The special-token fields an --init-from run sets itself (special_tokens' ids that replace the
// model directory's): a --tokenizer's bos, eos and pad (those it defines), --eos-id's eos.
std::vector<std::string> tokens_the_run_sets(const TrainConfig& c) {
  std::vector<std::string> out;
  if (!c.data.tokenizer.empty()) {
    const Tokenizer t(c.data.tokenizer);
    if (t.bos_id() >= 0) out.push_back("bos_token_id");
    if (t.pad_id() >= 0) out.push_back("pad_token_id");
  }
  if (c.data.eos_id >= 0) out.push_back("eos_token_id");  // --eos-id, or the tokenizer's (TrainConfig::check)
  return out;
}

// config.json of the model as trained: its dropout is the run's (TrainConfig::dropout).
nlohmann::json model_config(const TrainConfig& c, const SpecialTokens& tokens) {
  GptConfig trained = c.model;
  trained.dropout = c.dropout;
  return model_config_json(trained, c.bf16 ? DType::BF16 : DType::F32, tokens);
}

// Every parameter of the model with the layout a checkpoint uses for it, known on every rank. Without
// pp every rank holds every parameter. With pp a rank holds only its stages' parameters (on the
// stage's sub-mesh), so the ranks exchange descriptions; the tied embedding, held by the first and
// the last stage (the same values after every step), is described by its first stage's copy.
struct CatalogEntry {
  std::string name;
  Shape shape;
  reshard::Layout layout;
  ParamState* mine = nullptr;  // this rank's state when it holds the parameter under `layout`
};

nlohmann::json describe(const ParamState& p) {
  return {{"name", p.name},
          {"shape", std::vector<int64_t>(p.shape.begin(), p.shape.end())},
          {"mesh", std::vector<int64_t>(p.mesh.shape().begin(), p.mesh.shape().end())},
          {"ids", p.mesh.process_ids()},
          {"dims", p.mesh.dim_names()},
          {"dist", p.dist.to_string()}};
}

// Of `params`: the trainer's trained parameters, or its frozen ones (LoRA's base).
std::vector<CatalogEntry> catalog(Trainer& trainer, std::vector<ParamState>& params, comm::Communicator& world) {
  std::vector<CatalogEntry> out;
  if (trainer.strategy().pp < 0) {
    for (ParamState& p : params) out.push_back({p.name, p.shape, {p.mesh, p.dist}, &p});
    return out;
  }
  nlohmann::json mine = nlohmann::json::array();
  for (const ParamState& p : params) mine.push_back(describe(p));
  std::map<std::string, nlohmann::json> first;  // by name: the copy whose mesh starts at the lowest process
  for (const nlohmann::json& rank : comm::all_gather_object(world, mine)) {
    for (const nlohmann::json& d : rank) {
      auto [it, fresh] = first.try_emplace(d["name"].get<std::string>(), d);
      if (!fresh && d["ids"][0].get<int64_t>() < it->second["ids"][0].get<int64_t>()) it->second = d;
    }
  }
  for (auto& [name, d] : first) {
    mesh::ProcessMesh m(Shape(std::span<const int64_t>(d["mesh"].get<std::vector<int64_t>>())),
                        d["ids"].get<std::vector<int64_t>>(), d["dims"].get<std::vector<std::string>>());
    CatalogEntry e{name, Shape(std::span<const int64_t>(d["shape"].get<std::vector<int64_t>>())),
                   {m, mesh::parse_dist(d["dist"].get<std::string>(), m.ndim())}, nullptr};
    for (ParamState& p : params) {
      if (p.name == name && p.mesh == m) e.mine = &p;
    }
    out.push_back(std::move(e));
  }
  return out;
}

// Sharding stages 1-2: this rank's range of `p`'s block that its optimizer state covers (moments,
// a bf16 parameter's master), when `p` is one of `params`, the sharded trainer's; else none (whole).
std::optional<ckpt::FlatRange> state_range(const ShardedOptimizer* sharded, const std::vector<ParamState>& params,
                                           const ParamState* p) {
  if (!sharded || !p || params.empty() || p < params.data() || p >= params.data() + params.size()) return std::nullopt;
  const auto i = static_cast<size_t>(p - params.data());
  return ckpt::FlatRange{sharded->plan().begin(i), sharded->plan().count(i)};
}

// The range of `p`'s fp32 weights the rank holds: a bf16 parameter's master is its state range; an
// f32 parameter is its own master, whole on every rank.
std::optional<ckpt::FlatRange> weight_range(const ShardedOptimizer* sharded, const std::vector<ParamState>& params,
                                            const ParamState* p) {
  if (!p || p->param.dtype() == DType::F32) return std::nullopt;
  return state_range(sharded, params, p);
}

// The fp32 weights as held: the master, or an f32 parameter itself (sharding keeps no master for it).
Tensor fp32_weights(const ParamState& p) { return p.master.defined() ? p.master : p.param; }

std::string describe_fingerprint(const nlohmann::json& f) {
  if (f.contains("val_fraction")) {
    nlohmann::json rest = f;
    rest.erase("val_fraction");
    return fmt::format("{} less its last {} held out (--val-fraction)", describe_fingerprint(rest),
                       f["val_fraction"].get<double>());
  }
  if (f.contains("tokenizer")) {
    nlohmann::json rest = f;
    rest.erase("tokenizer");
    return fmt::format("{} tokenized by {}", describe_fingerprint(rest), f["tokenizer"].get<std::string>());
  }
  if (f.value("kind", "") == "addition")
    return fmt::format("the {}-digit addition task at seq {}", f.value("digits", 0), f.value("seq", 0));
  if (f.value("kind", "") == "files")
    return fmt::format("'{}' ({} files)", f.value("path", ""), f.value("files", nlohmann::json::array()).size());
  return fmt::format("'{}' ({} bytes, xxh64 of its first MiB {})", f.value("path", ""), f.value("size", int64_t{0}),
                     f.value("head_xxh64", ""));
}

// What makes the resumed run continue the saved one: the global batch (data position, schedule),
// the data (its fingerprint) and the generators' seed (dropout masks and the data order; the
// generators are counter-based, so seed and step are each rank's whole state).
void check_same_run(const nlohmann::json& state, const Trainer& trainer, const ckpt::fs::path& dir) {
  const TrainConfig& c = trainer.config();
  SW_CHECK(state.value("global_batch", int64_t{0}) == c.optimizer.global_batch,
           "checkpoint {} was trained with a global batch of {} sequences, this run uses {}: the data position "
           "and the schedule would not continue the same run",
           dir.string(), state.value("global_batch", int64_t{0}), c.optimizer.global_batch);
  // Checkpoints from before the fingerprint have none: nothing to compare.
  if (state.contains("data") && state["data"].contains("fingerprint")) {
    nlohmann::json saved_data = state["data"]["fingerprint"], my_data = trainer.data_fingerprint();
    saved_data.erase("path"), my_data.erase("path");  // the same file may move
    SW_CHECK(saved_data == my_data, "checkpoint {} was trained on {}, this run reads {}: resume with the same --data "
             "(or --digits and --seq), or start a fresh run in another --run-dir", dir.string(),
             describe_fingerprint(state["data"]["fingerprint"]), describe_fingerprint(trainer.data_fingerprint()));
  }
  const int64_t step = state.at("step").get<int64_t>();
  for (const nlohmann::json& rank : state.value("rng", nlohmann::json::array())) {
    const auto seed = rank.value("seed", c.optimizer.seed);
    SW_CHECK(seed == c.optimizer.seed && rank.value("step", step) == step,
             "checkpoint {} holds generator state seed {} at step {}, this run uses --seed {} at step {}: dropout "
             "masks and the data order would not continue the same run; resume with --seed {}", dir.string(), seed,
             rank.value("step", step), c.optimizer.seed, step, seed);
  }
}

}  // namespace

ckpt::CheckpointContent checkpoint_content(Trainer& trainer, comm::Communicator& world, bool model_only) {
  const TrainConfig& c = trainer.config();
  const bool lora = c.model.lora.enabled();
  ckpt::CheckpointContent content;
  content.step = trainer.steps_done();
  // GPT-2's layout: q/k/v in the fused c_attn, for the weights and their moments alike (Llama's:
  // every parameter under its own name). A LoRA run saves its adapters only, as PEFT does: one
  // adapter_model.safetensors in PEFT's keys (the fp32 masters: PEFT reads that one file, and a
  // resume continues from exact values).
  const ckpt::KeyMap keys = lora ? lora_key_map(c.model) : model_key_map(c.model);
  ckpt::KeyMap moment_keys = keys.with_suffix("/exp_avg");
  moment_keys.add(keys.with_suffix("/exp_avg_sq"));
  ckpt::TensorGroup model{lora ? "adapter_model" : "model", {}, keys, lora}, optimizer{"optimizer", {}, moment_keys},
      masters{"master_weights", {}, keys};
  const bool low_precision = c.bf16 && !lora;
  // Each rank's blocks as it holds them (shared, not copied). Under sharding stages 1-2 the moments
  // and bf16 parameters' masters are the rank's flat ranges of its blocks: the save writes each
  // range straight into the stored tensor (no gather); the kernels' weights are whole on every rank.
  std::vector<ParamState>& params = trainer.params();
  const ShardedOptimizer* sharded = trainer.sharded();
  for (const CatalogEntry& e : catalog(trainer, params, world)) {
    const ParamState* p = e.mine;
    const std::optional<ckpt::FlatRange> state = state_range(sharded, params, p),
                                         weights = weight_range(sharded, params, p);
    auto block = [&](Tensor ParamState::*field) { return p ? p->*field : Tensor(); };
    if (lora) {
      model.tensors.push_back({e.name, e.shape, DType::F32, e.layout, p ? fp32_weights(*p) : Tensor(), weights});
    } else {
      model.tensors.push_back({e.name, e.shape, low_precision ? DType::BF16 : DType::F32, e.layout, block(&ParamState::param)});
    }
    optimizer.tensors.push_back({e.name + "/exp_avg", e.shape, DType::F32, e.layout, block(&ParamState::exp_avg), state});
    optimizer.tensors.push_back(
        {e.name + "/exp_avg_sq", e.shape, DType::F32, e.layout, block(&ParamState::exp_avg_sq), state});
    if (low_precision)
      masters.tensors.push_back({e.name, e.shape, DType::F32, e.layout, p ? fp32_weights(*p) : Tensor(), weights});
  }
  content.groups.push_back(std::move(model));
  if (!model_only) content.groups.push_back(std::move(optimizer));
  if (!model_only && !masters.tensors.empty()) content.groups.push_back(std::move(masters));
  // The generators are counter-based and keyed by (seed, name, element index): a rank's state is
  // its seed and the step, the same on every rank; gathered anyway so a reader sees every rank.
  nlohmann::json rng = {{"kind", "philox4x32-10, keyed by (seed, tensor name, global element index)"},
                        {"seed", c.optimizer.seed},
                        {"step", trainer.steps_done()}};
  std::vector<nlohmann::json> ranks = comm::all_gather_object(world, rng);
  LrSchedule s = trainer.schedule();
  nlohmann::json state = {
      {"step", trainer.steps_done()},
      {"consumed_samples", trainer.consumed_samples()},
      {"global_batch", c.optimizer.global_batch},
      {"lr_schedule", {{"peak", s.peak}, {"floor", s.floor}, {"warmup", s.warmup}, {"total", s.total},
                       {"next_lr", s.at(trainer.steps_done())}}},
      {"optimizer", {{"name", "adamw"}, {"beta1", c.optimizer.adamw.beta1}, {"beta2", c.optimizer.adamw.beta2},
                     {"epsilon", c.optimizer.adamw.epsilon}, {"weight_decay", c.optimizer.adamw.weight_decay}, {"clip", c.optimizer.clip},
                     {"steps", trainer.optimizer_steps()}, {"state_saved", !model_only}}},
      {"data", {{"dataset", trainer.data_description()}, {"path", c.data.files}, {"digits", c.data.digits},
                {"seed", c.optimizer.seed}, {"next_sample", trainer.consumed_samples()},
                {"fingerprint", trainer.data_fingerprint()}}},
      {"mesh", trainer.strategy().mesh.to_string()},
      {"sequence_parallel", c.parallel.sequence_parallel},
      {"sharding", {{"stage", c.parallel.sharding.stage}, {"layout", c.parallel.sharding.layout}}},
      {"ranks", world.size()}};
  if (lora) {
    // The adapters mean nothing without their base: a resume checks it is the same.
    state["lora"] = {{"base", trainer.base_model().dir}, {"base_fingerprint", trainer.base_model().fingerprint},
                     {"model", {{"n_layer", c.model.layers}, {"n_embd", c.model.hidden}, {"n_head", c.model.heads},
                                {"n_positions", c.model.seq}, {"vocab_size", c.model.vocab}}}};
    content.json_files = {{"adapter_config.json", adapter_config_json(c.model, trainer.base_model().dir)}};
  } else {
    const SpecialTokens tokens = special_tokens(c);  // reads the tokenizer's model once per save
    nlohmann::json config = model_config(c, tokens), generation = generation_config_json(c.model, tokens);
    if (c.init_token_ids) {  // the --init-from model's own ids, except those the run sets
      const std::vector<std::string> set = tokens_the_run_sets(c);
      config = with_stored_token_ids(std::move(config), c.init_token_ids->config, set);
      generation = with_stored_token_ids(std::move(generation), c.init_token_ids->generation, set);
    }
    content.json_files = {{"config.json", std::move(config)}, {"generation_config.json", std::move(generation)}};
  }
  if (!model_only) state["rng"] = std::move(ranks);  // a model-only checkpoint resumes with fresh state only
  content.json_files.emplace_back("trainer_state.json", std::move(state));
  add_run_files(c, trainer.run_options(), trainer.base_model().dir, content);  // run_options.json, the tokenizer
  return content;
}

ckpt::fs::path save_trainer(Trainer& trainer, comm::Communicator& world, const ckpt::fs::path& root,
                            const ckpt::SaveOptions& options, bool model_only) {
  StreamScope on_compute(trainer.compute_stream());  // the staging copies follow the last update's kernels
  return ckpt::save_checkpoint(world, root, checkpoint_content(trainer, world, model_only), options);
}

namespace {

// The module paths `lora` adapts in `model`, and how its targets read.
std::vector<std::string> adapted(GptConfig model, const LoraConfig& lora) {
  model.lora = lora;
  std::vector<std::string> out;
  for (const LoraModule& m : lora_modules(model)) out.push_back(m.path);
  return out;
}
std::string targets_text(GptConfig model, const LoraConfig& l) {
  model.lora = l;
  return l.target_regex.empty() ? "[" + lora_targets_text(model) + "]" : "'" + l.target_regex + "'";
}

// The model of checkpoint `dir` against the run's: config.json's model_type and fields, or a LoRA
// checkpoint's adapter_config.json and base. Error naming each difference.
void check_same_model(Trainer& trainer, const ckpt::fs::path& dir) {
  const TrainConfig& c = trainer.config();
  const bool adapters = ckpt::fs::exists(dir / "adapter_config.json");
  if (!c.model.lora.enabled()) {
    SW_CHECK(!adapters, "checkpoint {} holds LoRA adapters (adapter_config.json), not a model: resume it with its "
             "--lora-* options and --init-from its base model", dir.string());
    nlohmann::json saved = ckpt::load_json(dir, "config.json"), mine = model_config(c, special_tokens(c));
    std::vector<std::string> differ;
    const std::string saved_type = saved.value("model_type", "");
    if (is_llama_model_type(saved_type) != c.model.is_llama())
      differ.push_back(fmt::format("model_type '{}' (checkpoint) vs '{}' (this run, --model)", saved_type,
                                   c.model.model_type));
    for (const std::string& key : model_identity_keys(c.model)) {
      if (!differ.empty()) break;  // another architecture: its fields are other keys
      if (saved.value(key, nlohmann::json()) != mine[key])
        differ.push_back(fmt::format("{} {} (checkpoint) vs {} (this run)", key,
                                     saved.value(key, nlohmann::json()).dump(), mine[key].dump()));
    }
    SW_CHECK(differ.empty(), "checkpoint {} holds another model: {}", dir.string(), fmt::join(differ, ", "));
    return;
  }
  SW_CHECK(adapters, "checkpoint {} holds a whole model, not LoRA adapters: a LoRA run resumes from its own "
           "checkpoints (start from a model with --init-from)", dir.string());
  const LoraConfig saved = read_adapter_config(dir), &mine = c.model.lora;
  std::vector<std::string> differ;
  if (saved.rank != mine.rank) differ.push_back(fmt::format("r {} (checkpoint) vs {} (this run)", saved.rank, mine.rank));
  if (saved.alpha != mine.alpha)
    differ.push_back(fmt::format("lora_alpha {} (checkpoint) vs {} (this run)", saved.alpha, mine.alpha));
  if (saved.rslora != mine.rslora)
    differ.push_back(fmt::format("use_rslora {} (checkpoint) vs {} (this run)", saved.rslora, mine.rslora));
  if (saved.dropout != mine.dropout)
    differ.push_back(fmt::format("lora_dropout {} (checkpoint) vs {} (this run)", saved.dropout, mine.dropout));
  if (adapted(c.model, saved) != adapted(c.model, mine))
    differ.push_back(fmt::format("target_modules {} (checkpoint) vs {} (this run)", targets_text(c.model, saved),
                                 targets_text(c.model, mine)));
  SW_CHECK(differ.empty(), "checkpoint {} holds other adapters: {}", dir.string(), fmt::join(differ, ", "));
  const nlohmann::json lora = ckpt::load_json(dir, "trainer_state.json").value("lora", nlohmann::json::object());
  const std::string fingerprint = lora.value("base_fingerprint", "");
  SW_CHECK(fingerprint == trainer.base_model().fingerprint,
           "checkpoint {} trained its adapters on the base model '{}', this run's base is '{}' (another model or "
           "other weights): resume with --init-from the checkpoint's base", dir.string(), lora.value("base", ""),
           trainer.base_model().dir.empty() ? "(the seeded initialization)" : trainer.base_model().dir);
}

// A base parameter's new weights (f32): into the master (the kernels' copy follows), or, frozen,
// into the kernels' copy itself. Under sharding stages 1-2 an f32 parameter has no master: into
// the parameter.
void set_weights(ParamState& p, const Tensor& w) {
  if (!p.master.defined()) {
    p.param = p.param.dtype() == DType::F32 ? w : w.to(p.param.dtype());
    return;
  }
  std::copy(w.data<float>(), w.data<float>() + w.numel(), p.master.data<float>());
  if (p.param.raw() != p.master.raw()) p.param = p.master.to(p.param.dtype());
}

// Loaded fp32 weights into a trained parameter: `ranged` (weight_range), the rank's range of a bf16
// parameter's master (the kernels' copy is gathered after, ShardedOptimizer::gather_params); else
// the whole block.
void take_weights(ParamState& p, const Tensor& w, bool ranged) {
  if (ranged) p.master = w;
  else set_weights(p, w);
}

// Loaded moments: the rank's ranges under sharding (the loaded 1-D tensors themselves), else copied
// into the blocks.
void take_moments(ParamState& p, const Tensor& m, const Tensor& v, bool ranged) {
  if (ranged) {
    p.exp_avg = m, p.exp_avg_sq = v;
    return;
  }
  std::copy(m.data<float>(), m.data<float>() + m.numel(), p.exp_avg.data<float>());
  std::copy(v.data<float>(), v.data<float>() + v.numel(), p.exp_avg_sq.data<float>());
}

// A grown parameter's (vocab_resize.h) weights as this rank holds them: its block, or under
// sharding stages 1-2 a bf16 parameter's range of the master.
Tensor grown_weights(const ckpt::fs::path& dir, const ParamState& p, int64_t old_vocab, const Tensor& added,
                     int64_t me, ShardedOptimizer* sharded, const std::vector<ParamState>& params) {
  const mesh::LocalBlock block =
      mesh::local_block(p.shape, p.dist, p.mesh, p.mesh.coords(p.mesh.rank_index_of_process(me)));
  Tensor w = grown_block(dir, p.name, old_vocab, added, block.offsets(), block.shape);
  const std::optional<ckpt::FlatRange> range = weight_range(sharded, params, &p);
  if (!range) return w;
  Tensor part(DType::F32, Shape{range->count});
  std::copy_n(w.data<float>() + range->begin, range->count, part.data<float>());
  return part;
}

}  // namespace

namespace {

// A device run's state goes to the host for the load's host code and back after (counted copies).
template <class Load>
auto load_on_host(Trainer& trainer, Load&& load) {
  StreamScope on_compute(trainer.compute_stream());  // the copies follow (and precede) the steps' kernels
  trainer.move_state(Device::host());
  auto result = load();
  trainer.move_state(trainer.config().device);
  return result;
}

void load_trainer_here(Trainer& trainer, comm::Communicator& world, const ckpt::fs::path& dir, bool skip_optimizer);
int64_t init_from_model_here(Trainer& trainer, comm::Communicator& world, const ckpt::fs::path& dir,
                             const std::vector<std::string>& ignore_keys);

}  // namespace

void load_trainer(Trainer& trainer, comm::Communicator& world, const ckpt::fs::path& dir, bool skip_optimizer) {
  load_on_host(trainer, [&] {
    load_trainer_here(trainer, world, dir, skip_optimizer);
    return 0;
  });
}

int64_t init_from_model(Trainer& trainer, comm::Communicator& world, const ckpt::fs::path& dir,
                        const std::vector<std::string>& ignore_keys) {
  return load_on_host(trainer, [&] { return init_from_model_here(trainer, world, dir, ignore_keys); });
}

namespace {

void load_trainer_here(Trainer& trainer, comm::Communicator& world, const ckpt::fs::path& dir, bool skip_optimizer) {
  check_same_model(trainer, dir);
  const bool has_moments = ckpt::GroupReader::exists(dir, "optimizer");
  SW_CHECK(has_moments || skip_optimizer, "checkpoint {} holds no optimizer state (saved with --save-model-only): "
           "--resume it with --skip-optimizer (fresh AdamW moments at its step), or start a new run with --init-from "
           "it", dir.string());
  const bool moments_too = !skip_optimizer;
  const bool lora = trainer.config().model.lora.enabled();
  const int64_t me = world.members()[static_cast<size_t>(world.rank())];
  // Strict on the whole catalog (every key named when missing or unexpected); then, with pp, a
  // second read for the copies a rank holds under another layout (the last stage's tied embedding).
  bool has_masters = ckpt::fs::exists(dir / "master_weights.safetensors.index.json");
  // GPT-2's layout, or the earlier one (separate q/k/v keys) as it was saved; PEFT's for adapters.
  const ckpt::KeyMap weight_keys =
      lora ? lora_key_map(trainer.config().model) : key_map_for(dir, trainer.config().model);
  const std::string weight_group = lora ? "adapter_model" : has_masters ? "master_weights" : "model";
  ckpt::KeyMap moment_keys = weight_keys.with_suffix("/exp_avg");
  moment_keys.add(weight_keys.with_suffix("/exp_avg_sq"));
  // Each rank reads only what it holds: under sharding stages 1-2 its ranges of the moments and of
  // bf16 parameters' masters (state_range, weight_range).
  struct Wanted {
    std::string name;
    Shape shape;
    reshard::Layout layout;
    std::optional<ckpt::FlatRange> weights, state;
  };
  auto read = [&](const std::vector<Wanted>& wanted, std::map<std::string, Tensor>& weights,
                  std::map<std::string, Tensor>& moments, bool strict) {
    std::vector<ckpt::LoadSpec> model, optimizer;
    for (const auto& [name, shape, layout, weight_part, state_part] : wanted) {
      model.push_back({name, shape, DType::F32, layout, weight_part});
      optimizer.push_back({name + "/exp_avg", shape, DType::F32, layout, state_part});
      optimizer.push_back({name + "/exp_avg_sq", shape, DType::F32, layout, state_part});
    }
    ckpt::LoadOptions o;
    if (!strict) o.ignore_keys = {"*"};
    o.keys = weight_keys;
    o.convert_dtype = !has_masters;  // a --save-model-only checkpoint of a --bf16 run: its bf16 weights
    // Masters when the checkpoint has them (lower-precision weights), else the weights themselves.
    for (auto& [k, t] : ckpt::load_group(dir, weight_group, model, me, o))
      if (t.defined()) weights[k] = t;
    o.keys = moment_keys;
    o.convert_dtype = false;
    if (!moments_too) return;
    for (auto& [k, t] : ckpt::load_group(dir, "optimizer", optimizer, me, o))
      if (t.defined()) moments[k] = t;
  };
  std::map<std::string, Tensor> weights, moments;
  std::vector<Wanted> all, others;
  std::vector<ParamState>& params = trainer.params();
  ShardedOptimizer* sharded = trainer.sharded();
  auto wanted = [&](const std::string& name, const Shape& shape, const reshard::Layout& layout, const ParamState* p) {
    return Wanted{name, shape, layout, weight_range(sharded, params, p), state_range(sharded, params, p)};
  };
  for (const CatalogEntry& e : catalog(trainer, params, world)) all.push_back(wanted(e.name, e.shape, e.layout, e.mine));
  read(all, weights, moments, true);
  for (ParamState& p : params) {
    if (!weights.count(p.name)) others.push_back(wanted(p.name, p.shape, {p.mesh, p.dist}, &p));
  }
  if (!others.empty()) read(others, weights, moments, false);
  for (ParamState& p : params) {
    take_weights(p, weights.at(p.name), weight_range(sharded, params, &p).has_value());
    if (moments_too)
      take_moments(p, moments.at(p.name + "/exp_avg"), moments.at(p.name + "/exp_avg_sq"), sharded != nullptr);
  }
  if (sharded) sharded->gather_params(params);
  nlohmann::json state = ckpt::load_json(dir, "trainer_state.json");
  check_same_run(state, trainer, dir);
  const int64_t step = state.at("step").get<int64_t>();
  const int64_t optimizer_steps =
      !moments_too ? 0 : state.value("optimizer", nlohmann::json::object()).value("steps", step);
  trainer.restore_position(step, state.at("consumed_samples").get<int64_t>(), optimizer_steps);
}

int64_t init_from_model_here(Trainer& trainer, comm::Communicator& world, const ckpt::fs::path& dir,
                             const std::vector<std::string>& ignore_keys) {
  const GptConfig saved = read_model_config(dir), &mine = trainer.config().model;
  // A vocabulary the run grows (TrainConfig::init_vocab) is the directory's model with more rows.
  GptConfig grown = saved;
  if (trainer.config().init_vocab == saved.vocab && mine.vocab > saved.vocab) grown.vocab = mine.vocab;
  const std::vector<std::string> differ = model_differences(grown, mine);
  SW_CHECK(differ.empty(), "--init-from {} holds another model: {}", dir.string(), fmt::join(differ, ", "));
  SW_CHECK(grown.vocab == saved.vocab || !mine.lora.enabled(), "--init-from {}: its vocabulary grows from {} to {} "
           "tokens, and LoRA keeps the embedding frozen, so the added tokens' rows would never train (PEFT trains them "
           "through modules_to_save, which shardwise's LoRA does not support): fine-tune the whole model", dir.string(),
           saved.vocab, mine.vocab);
  const std::map<std::string, Tensor> added = added_vocab_rows(world, dir, saved, grown, trainer.config().optimizer.seed);
  const int64_t me = world.members()[static_cast<size_t>(world.rank())];
  // The model's weights: its parameters (under sharding stages 1-2 a bf16 parameter's range of the
  // master), or with LoRA the frozen base.
  std::vector<ParamState>& params = mine.lora.enabled() ? trainer.frozen() : trainer.params();
  ShardedOptimizer* sharded = mine.lora.enabled() ? nullptr : trainer.sharded();
  // Strict on the whole catalog, then (pp) the copies a rank holds under another layout.
  std::vector<ckpt::LoadSpec> all, others;
  // A skipped parameter is not read even when the directory has it.
  const ckpt::KeyMap keys = key_map_for(dir, saved);
  auto skipped = [&](const std::string& name) {
    if (added.count(name)) return true;  // grown: read below
    for (const std::string& g : ignore_keys) {
      if (::fnmatch(g.c_str(), name.c_str(), 0) == 0) return true;
      for (const ckpt::KeyPlacement& p : keys.placements(name))
        if (::fnmatch(g.c_str(), p.key.c_str(), 0) == 0) return true;
    }
    return false;
  };
  for (const CatalogEntry& e : catalog(trainer, params, world)) {
    if (!skipped(e.name)) all.push_back({e.name, e.shape, DType::F32, e.layout, weight_range(sharded, params, e.mine)});
  }
  std::map<std::string, Tensor> weights;
  std::vector<std::string> unread = ignore_keys;  // and the grown parameters, read by grown_weights
  for (const auto& [name, rows] : added) unread.push_back(name);
  for (auto& [k, t] : load_model_weights(dir, saved, all, me, unread))
    if (t.defined()) weights[k] = t;
  for (ParamState& p : params) {
    if (!weights.count(p.name) && !skipped(p.name))
      others.push_back({p.name, p.shape, DType::F32, {p.mesh, p.dist}, weight_range(sharded, params, &p)});
  }
  if (!others.empty()) {
    for (auto& [k, t] : load_model_weights(dir, saved, others, me, {"*"}))
      if (t.defined()) weights[k] = t;
  }
  std::set<std::string> stored;  // the file keys read: a fused c_attn is one, stacked experts are many
  for (ParamState& p : params) {
    if (added.count(p.name)) weights[p.name] = grown_weights(dir, p, saved.vocab, added.at(p.name), me, sharded, params);
    auto it = weights.find(p.name);
    if (it == weights.end()) continue;  // ignored: keeps its initialization
    take_weights(p, it->second, weight_range(sharded, params, &p).has_value());
    std::span<const ckpt::KeyPlacement> places = keys.placements(p.name);
    if (places.empty()) stored.insert(p.name);
    for (const ckpt::KeyPlacement& place : places) stored.insert(place.key);
  }
  if (sharded) sharded->gather_params(params);
  trainer.set_base_model({dir.string(), model_fingerprint(dir)});
  return static_cast<int64_t>(stored.size());
}

}  // namespace

int64_t load_adapter(Trainer& trainer, comm::Communicator& world, const ckpt::fs::path& dir) {
  const GptConfig& model = trainer.config().model;
  SW_CHECK(model.lora.enabled(), "--lora-from {}: the run trains no adapters", dir.string());
  SW_CHECK(ckpt::GroupReader::exists(dir, "adapter_model"), "--lora-from '{}' has no adapter_model.safetensors",
           dir.string());
  const int64_t me = world.members()[static_cast<size_t>(world.rank())];
  ckpt::LoadOptions o;
  o.keys = lora_key_map(model);
  o.convert_dtype = true;  // PEFT saves adapters in the model's dtype
  auto read = [&](const std::vector<ckpt::LoadSpec>& specs, bool strict) {
    o.ignore_keys = strict ? std::vector<std::string>{} : std::vector<std::string>{"*"};
    try {
      return ckpt::load_group(dir, "adapter_model", specs, me, o);
    } catch (const Error& e) {
      fail("--lora-from {}: {} (an adapter of another rank, other target modules or another model?)", dir.string(),
           e.what());
    }
  };
  std::vector<ckpt::LoadSpec> all, others;
  std::vector<ParamState>& params = trainer.params();
  ShardedOptimizer* sharded = trainer.sharded();  // a bf16 adapter keeps its range of the master
  for (const CatalogEntry& e : catalog(trainer, params, world))
    all.push_back({e.name, e.shape, DType::F32, e.layout, weight_range(sharded, params, e.mine)});
  std::map<std::string, Tensor> weights;
  for (auto& [k, t] : read(all, true))
    if (t.defined()) weights[k] = t;
  for (ParamState& p : params) {
    if (!weights.count(p.name))
      others.push_back({p.name, p.shape, DType::F32, {p.mesh, p.dist}, weight_range(sharded, params, &p)});
  }
  if (!others.empty()) {
    for (auto& [k, t] : read(others, false))
      if (t.defined()) weights[k] = t;
  }
  for (ParamState& p : params) take_weights(p, weights.at(p.name), weight_range(sharded, params, &p).has_value());
  if (sharded) sharded->gather_params(params);
  return static_cast<int64_t>(all.size());
}

CheckpointSchedule::CheckpointSchedule(ckpt::fs::path root, int64_t every, bool async, ckpt::SaveOptions options,
                                       bool model_only)
    : root_(std::move(root)), every_(every), options_(options), model_only_(model_only) {
  if (async) async_ = std::make_unique<ckpt::AsyncSaver>(options_);
}

std::optional<ckpt::fs::path> CheckpointSchedule::after_step(Trainer& trainer, comm::Communicator& world, bool force) {
  if (!force && (every_ <= 0 || trainer.steps_done() % every_ != 0)) return std::nullopt;
  StreamScope on_compute(trainer.compute_stream());  // the staging copies follow the last update's kernels
  std::optional<ckpt::fs::path> dir;
  const auto start = std::chrono::steady_clock::now();
  if (async_) {
    async_->save(world, root_, checkpoint_content(trainer, world, model_only_));
  } else {
    dir = save_trainer(trainer, world, root_, options_, model_only_);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ++stalls_.saves;
  stalls_.total_s += s;
  stalls_.longest_s = std::max(stalls_.longest_s, s);
  return dir;
}

std::optional<ckpt::fs::path> CheckpointSchedule::finish() {
  if (async_) return async_->finish();
  return std::nullopt;
}

}  // namespace shardwise::train
