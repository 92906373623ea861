#include "shardwise/train/checkpointing.h"

#include <fnmatch.h>

#include <filesystem>
#include <fstream>

#include "shardwise/ckpt/checksum.h"
#include "shardwise/comm/objects.h"
#include "shardwise/core/error.h"
#include "shardwise/train/model_io.h"

namespace shardwise::train {
namespace {

nlohmann::json model_config(const TrainConfig& c) {
  return model_config_json(c.model, c.bf16 ? DType::BF16 : DType::F32, default_special_tokens(c.model.vocab));
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

std::vector<CatalogEntry> catalog(Trainer& trainer, comm::Communicator& world) {
  std::vector<CatalogEntry> out;
  if (trainer.strategy().pp < 0) {
    for (ParamState& p : trainer.params()) out.push_back({p.name, p.shape, {p.mesh, p.dist}, &p});
    return out;
  }
  nlohmann::json mine = nlohmann::json::array();
  for (const ParamState& p : trainer.params()) mine.push_back(describe(p));
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
    for (ParamState& p : trainer.params()) {
      if (p.name == name && p.mesh == m) e.mine = &p;
    }
    out.push_back(std::move(e));
  }
  return out;
}

// What the run reads, to refuse a resume on other data: the file's size and the xxh64 of its first
// and last MiB (its path only for the message), or the embedded task's digits and sequence length.
// Several files (a list or a glob): the sorted file names (without their folder) and sizes.
nlohmann::json file_fingerprint(const TrainConfig& c) {
  if (c.data.empty()) return {{"kind", "addition"}, {"digits", c.digits}, {"seq", c.model.seq}};
  if (const std::vector<std::string> files = data_files(c.data); files.size() > 1) {
    nlohmann::json list = nlohmann::json::array();
    for (const std::string& file : files) {
      std::error_code ec;
      const auto size = static_cast<int64_t>(std::filesystem::file_size(file, ec));
      SW_CHECK(!ec, "cannot read the data file '{}'", file);
      list.push_back({{"name", std::filesystem::path(file).filename().string()}, {"size", size}});
    }
    return {{"kind", "files"}, {"path", c.data}, {"files", list}};
  }
  std::ifstream f(data_files(c.data).front(), std::ios::binary);
  SW_CHECK(f.good(), "cannot read the data file '{}'", c.data);
  f.seekg(0, std::ios::end);
  const auto size = static_cast<int64_t>(f.tellg());
  auto mib_at = [&](int64_t offset) {
    std::vector<std::byte> buf(static_cast<size_t>(std::min<int64_t>(size - offset, int64_t{1} << 20)));
    f.seekg(offset);
    f.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
    return ckpt::xxh64_hex(buf);
  };
  return {{"kind", "file"}, {"path", c.data}, {"size", size}, {"head_xxh64", mib_at(0)},
          {"tail_xxh64", mib_at(std::max<int64_t>(0, size - (int64_t{1} << 20)))}};
}

nlohmann::json data_fingerprint(const TrainConfig& c) {
  nlohmann::json f = file_fingerprint(c);
  // --val-fraction holds out the corpus' tail: another fraction trains on other windows. (Absent
  // without one, so checkpoints from before it still match.)
  if (c.val_fraction != 0) f["val_fraction"] = c.val_fraction;
  return f;
}

std::string describe_fingerprint(const nlohmann::json& f) {
  if (f.contains("val_fraction")) {
    nlohmann::json rest = f;
    rest.erase("val_fraction");
    return fmt::format("{} less its last {} held out (--val-fraction)", describe_fingerprint(rest),
                       f["val_fraction"].get<double>());
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
void check_same_run(const nlohmann::json& state, const TrainConfig& c, const ckpt::fs::path& dir) {
  SW_CHECK(state.value("global_batch", int64_t{0}) == c.global_batch,
           "checkpoint {} was trained with a global batch of {} sequences, this run uses {}: the data position "
           "and the schedule would not continue the same run",
           dir.string(), state.value("global_batch", int64_t{0}), c.global_batch);
  // Checkpoints from before the fingerprint have none: nothing to compare.
  if (state.contains("data") && state["data"].contains("fingerprint")) {
    nlohmann::json saved_data = state["data"]["fingerprint"], my_data = data_fingerprint(c);
    saved_data.erase("path"), my_data.erase("path");  // the same file may move
    SW_CHECK(saved_data == my_data, "checkpoint {} was trained on {}, this run reads {}: resume with the same --data "
             "(or --digits and --seq), or start a fresh run in another --run-dir", dir.string(),
             describe_fingerprint(state["data"]["fingerprint"]), describe_fingerprint(data_fingerprint(c)));
  }
  const int64_t step = state.at("step").get<int64_t>();
  for (const nlohmann::json& rank : state.value("rng", nlohmann::json::array())) {
    const auto seed = rank.value("seed", c.seed);
    SW_CHECK(seed == c.seed && rank.value("step", step) == step,
             "checkpoint {} holds generator state seed {} at step {}, this run uses --seed {} at step {}: dropout "
             "masks and the data order would not continue the same run; resume with --seed {}", dir.string(), seed,
             rank.value("step", step), c.seed, step, seed);
  }
}

}  // namespace

ckpt::CheckpointContent checkpoint_content(Trainer& trainer, comm::Communicator& world) {
  const TrainConfig& c = trainer.config();
  ckpt::CheckpointContent content;
  content.step = trainer.steps_done();
  // GPT-2's layout: q/k/v in the fused c_attn, for the weights and their moments alike (Llama's:
  // every parameter under its own name).
  const ckpt::KeyMap keys = model_key_map(c.model);
  ckpt::KeyMap moment_keys = keys.with_suffix("/exp_avg");
  moment_keys.add(keys.with_suffix("/exp_avg_sq"));
  ckpt::TensorGroup model{"model", {}, keys}, optimizer{"optimizer", {}, moment_keys},
      masters{"master_weights", {}, keys};
  const DType stored = c.bf16 ? DType::BF16 : DType::F32;
  for (const CatalogEntry& e : catalog(trainer, world)) {
    auto block = [&](Tensor ParamState::*field) { return e.mine ? e.mine->*field : Tensor(); };
    model.tensors.push_back({e.name, e.shape, stored, e.layout, block(&ParamState::param)});
    optimizer.tensors.push_back({e.name + "/exp_avg", e.shape, DType::F32, e.layout, block(&ParamState::exp_avg)});
    optimizer.tensors.push_back({e.name + "/exp_avg_sq", e.shape, DType::F32, e.layout, block(&ParamState::exp_avg_sq)});
    if (c.bf16) masters.tensors.push_back({e.name, e.shape, DType::F32, e.layout, block(&ParamState::master)});
  }
  content.groups.push_back(std::move(model));
  content.groups.push_back(std::move(optimizer));
  if (!masters.tensors.empty()) content.groups.push_back(std::move(masters));
  // The generators are counter-based and keyed by (seed, name, element index): a rank's state is
  // its seed and the step, the same on every rank; gathered anyway so a reader sees every rank.
  nlohmann::json rng = {{"kind", "philox4x32-10, keyed by (seed, tensor name, global element index)"},
                        {"seed", c.seed},
                        {"step", trainer.steps_done()}};
  std::vector<nlohmann::json> ranks = comm::all_gather_object(world, rng);
  LrSchedule s = trainer.schedule();
  content.json_files = {
      {"config.json", model_config(c)},
      {"generation_config.json", generation_config_json(c.model, default_special_tokens(c.model.vocab))},
      {"trainer_state.json",
       {{"step", trainer.steps_done()},
        {"consumed_samples", trainer.consumed_samples()},
        {"global_batch", c.global_batch},
        {"lr_schedule", {{"peak", s.peak}, {"floor", s.floor}, {"warmup", s.warmup}, {"total", s.total},
                         {"next_lr", s.at(trainer.steps_done())}}},
        {"optimizer", {{"name", "adamw"}, {"beta1", c.adamw.beta1}, {"beta2", c.adamw.beta2},
                       {"epsilon", c.adamw.epsilon}, {"weight_decay", c.adamw.weight_decay}, {"clip", c.clip}}},
        {"data", {{"dataset", trainer.dataset().describe()}, {"path", c.data}, {"digits", c.digits},
                  {"seed", c.seed}, {"next_sample", trainer.consumed_samples()},
                  {"fingerprint", data_fingerprint(c)}}},
        {"rng", ranks},
        {"mesh", trainer.strategy().mesh.to_string()},
        {"sequence_parallel", c.sequence_parallel},
        {"ranks", world.size()}}}};
  return content;
}

ckpt::fs::path save_trainer(Trainer& trainer, comm::Communicator& world, const ckpt::fs::path& root,
                            const ckpt::SaveOptions& options) {
  return ckpt::save_checkpoint(world, root, checkpoint_content(trainer, world), options);
}

void load_trainer(Trainer& trainer, comm::Communicator& world, const ckpt::fs::path& dir) {
  nlohmann::json saved = ckpt::load_json(dir, "config.json"), mine = model_config(trainer.config());
  std::vector<std::string> differ;
  const std::string saved_type = saved.value("model_type", "");
  if ((saved_type == "llama") != trainer.config().model.is_llama())
    differ.push_back(fmt::format("model_type '{}' (checkpoint) vs '{}' (this run, --model)", saved_type,
                                 trainer.config().model.model_type));
  for (const std::string& key : model_identity_keys(trainer.config().model)) {
    if (!differ.empty()) break;
    if (saved.value(key, nlohmann::json()) != mine[key])
      differ.push_back(fmt::format("{} {} (checkpoint) vs {} (this run)", key, saved.value(key, nlohmann::json()).dump(),
                                   mine[key].dump()));
  }
  SW_CHECK(differ.empty(), "checkpoint {} holds another model: {}", dir.string(), fmt::join(differ, ", "));
  const int64_t me = world.members()[static_cast<size_t>(world.rank())];
  // Strict on the whole catalog (every key named when missing or unexpected); then, with pp, a
  // second read for the copies a rank holds under another layout (the last stage's tied embedding).
  bool has_masters = ckpt::fs::exists(dir / "master_weights.safetensors.index.json");
  // GPT-2's layout, or the earlier one (separate q/k/v keys) as it was saved.
  const ckpt::KeyMap weight_keys = key_map_for(dir, trainer.config().model);
  ckpt::KeyMap moment_keys = weight_keys.with_suffix("/exp_avg");
  moment_keys.add(weight_keys.with_suffix("/exp_avg_sq"));
  struct Wanted {
    std::string name;
    Shape shape;
    reshard::Layout layout;
  };
  auto read = [&](const std::vector<Wanted>& wanted, std::map<std::string, Tensor>& weights,
                  std::map<std::string, Tensor>& moments, bool strict) {
    std::vector<ckpt::LoadSpec> model, optimizer;
    for (const auto& [name, shape, layout] : wanted) {
      model.push_back({name, shape, DType::F32, layout});
      optimizer.push_back({name + "/exp_avg", shape, DType::F32, layout});
      optimizer.push_back({name + "/exp_avg_sq", shape, DType::F32, layout});
    }
    ckpt::LoadOptions o;
    if (!strict) o.ignore_keys = {"*"};
    o.keys = weight_keys;
    // Masters when the checkpoint has them (lower-precision weights), else the weights themselves.
    for (auto& [k, t] : ckpt::load_group(dir, has_masters ? "master_weights" : "model", model, me, o))
      if (t.defined()) weights[k] = t;
    o.keys = moment_keys;
    for (auto& [k, t] : ckpt::load_group(dir, "optimizer", optimizer, me, o))
      if (t.defined()) moments[k] = t;
  };
  std::map<std::string, Tensor> weights, moments;
  std::vector<Wanted> all, others;
  for (const CatalogEntry& e : catalog(trainer, world)) all.push_back({e.name, e.shape, e.layout});
  read(all, weights, moments, true);
  for (ParamState& p : trainer.params()) {
    if (!weights.count(p.name)) others.push_back({p.name, p.shape, {p.mesh, p.dist}});
  }
  if (!others.empty()) read(others, weights, moments, false);
  for (ParamState& p : trainer.params()) {
    const Tensor& w = weights.at(p.name);
    std::copy(w.data<float>(), w.data<float>() + w.numel(), p.master.data<float>());
    if (p.param.raw() != p.master.raw()) p.param = p.master.to(p.param.dtype());
    const Tensor &m = moments.at(p.name + "/exp_avg"), &v = moments.at(p.name + "/exp_avg_sq");
    std::copy(m.data<float>(), m.data<float>() + m.numel(), p.exp_avg.data<float>());
    std::copy(v.data<float>(), v.data<float>() + v.numel(), p.exp_avg_sq.data<float>());
  }
  nlohmann::json state = ckpt::load_json(dir, "trainer_state.json");
  check_same_run(state, trainer.config(), dir);
  trainer.restore_position(state.at("step").get<int64_t>(), state.at("consumed_samples").get<int64_t>());
}

int64_t init_from_model(Trainer& trainer, comm::Communicator& world, const ckpt::fs::path& dir,
                        const std::vector<std::string>& ignore_keys) {
  const GptConfig saved = read_model_config(dir), &mine = trainer.config().model;
  const std::vector<std::string> differ = model_differences(saved, mine);
  SW_CHECK(differ.empty(), "--init-from {} holds another model: {}", dir.string(), fmt::join(differ, ", "));
  const int64_t me = world.members()[static_cast<size_t>(world.rank())];
  // Strict on the whole catalog, then (pp) the copies a rank holds under another layout.
  std::vector<ckpt::LoadSpec> all, others;
  // A skipped parameter is not read even when the directory has it.
  const ckpt::KeyMap keys = key_map_for(dir, saved);
  auto skipped = [&](const std::string& name) {
    const ckpt::KeyPlacement* p = keys.find(name);
    for (const std::string& g : ignore_keys) {
      if (::fnmatch(g.c_str(), name.c_str(), 0) == 0 || (p && ::fnmatch(g.c_str(), p->key.c_str(), 0) == 0)) return true;
    }
    return false;
  };
  for (const CatalogEntry& e : catalog(trainer, world)) {
    if (!skipped(e.name)) all.push_back({e.name, e.shape, DType::F32, e.layout});
  }
  std::map<std::string, Tensor> weights;
  for (auto& [k, t] : load_model_weights(dir, saved, all, me, ignore_keys))
    if (t.defined()) weights[k] = t;
  for (ParamState& p : trainer.params()) {
    if (!weights.count(p.name) && !skipped(p.name)) others.push_back({p.name, p.shape, DType::F32, {p.mesh, p.dist}});
  }
  if (!others.empty()) {
    for (auto& [k, t] : load_model_weights(dir, saved, others, me, {"*"}))
      if (t.defined()) weights[k] = t;
  }
  int64_t loaded = 0;
  for (ParamState& p : trainer.params()) {
    auto it = weights.find(p.name);
    if (it == weights.end()) continue;  // ignored: keeps its initialization
    std::copy(it->second.data<float>(), it->second.data<float>() + it->second.numel(), p.master.data<float>());
    if (p.param.raw() != p.master.raw()) p.param = p.master.to(p.param.dtype());
    ++loaded;
  }
  return loaded;
}

CheckpointSchedule::CheckpointSchedule(ckpt::fs::path root, int64_t every, bool async, ckpt::SaveOptions options)
    : root_(std::move(root)), every_(every), options_(options) {
  if (async) async_ = std::make_unique<ckpt::AsyncSaver>(options_);
}

std::optional<ckpt::fs::path> CheckpointSchedule::after_step(Trainer& trainer, comm::Communicator& world, bool force) {
  if (!force && (every_ <= 0 || trainer.steps_done() % every_ != 0)) return std::nullopt;
  std::optional<ckpt::fs::path> dir;
  if (async_) {
    async_->save(world, root_, checkpoint_content(trainer, world));
  } else {
    dir = save_trainer(trainer, world, root_, options_);
  }
  return dir;
}

std::optional<ckpt::fs::path> CheckpointSchedule::finish() {
  if (async_) return async_->finish();
  return std::nullopt;
}

}  // namespace shardwise::train
