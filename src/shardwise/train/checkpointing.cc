#include "shardwise/train/checkpointing.h"

#include <chrono>

#include "shardwise/comm/objects.h"
#include "shardwise/core/error.h"

namespace shardwise::train {
namespace {

nlohmann::json model_config(const TrainConfig& c) {
  const GptConfig& m = c.model;
  // Hugging Face GPT-2 field names where they exist; q/k/v are separate projections here.
  return {{"architectures", {"ShardwiseGPT"}},
          {"model_type", "shardwise_gpt"},
          {"n_layer", m.layers},
          {"n_head", m.heads},
          {"n_embd", m.hidden},
          {"n_positions", m.seq},
          {"vocab_size", m.vocab},
          {"layer_norm_epsilon", m.layer_norm_epsilon},
          {"initializer_range", m.init_std},
          {"activation_function", "gelu_new"},
          {"tie_word_embeddings", true},
          {"torch_dtype", c.bf16 ? "bfloat16" : "float32"}};
}

reshard::Layout layout_of(const Trainer& t, const ParamState& p) { return {t.strategy().mesh, p.dist}; }

}  // namespace

ckpt::CheckpointContent checkpoint_content(Trainer& trainer, comm::Communicator& world) {
  const TrainConfig& c = trainer.config();
  // On pp meshes each rank holds only its stages' parameters, laid out on the stage's slice of the
  // mesh, and the tied embedding lives on two stages: not wired to checkpoints yet.
  SW_CHECK(trainer.pipeline() == nullptr,
           "checkpoints of pipeline-parallel runs (mesh {}) are not supported yet; train with pp to the end, or "
           "save from a mesh without pp",
           trainer.strategy().mesh.to_string());
  ckpt::CheckpointContent content;
  content.step = trainer.steps_done();
  ckpt::TensorGroup model{"model", {}}, optimizer{"optimizer", {}}, masters{"master_weights", {}};
  for (ParamState& p : trainer.params()) {
    Shape global = trainer.param_shape(p.name);
    model.tensors.push_back({p.name, global, p.param.dtype(), layout_of(trainer, p), p.param});
    optimizer.tensors.push_back({p.name + "/exp_avg", global, DType::F32, layout_of(trainer, p), p.exp_avg});
    optimizer.tensors.push_back({p.name + "/exp_avg_sq", global, DType::F32, layout_of(trainer, p), p.exp_avg_sq});
    if (p.param.dtype() != DType::F32) masters.tensors.push_back({p.name, global, DType::F32, layout_of(trainer, p), p.master});
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
      {"generation_config.json", {{"max_length", c.model.seq}, {"do_sample", false}, {"eos_token_id", 10}}},
      {"trainer_state.json",
       {{"step", trainer.steps_done()},
        {"consumed_samples", trainer.consumed_samples()},
        {"global_batch", c.global_batch},
        {"lr_schedule", {{"peak", s.peak}, {"floor", s.floor}, {"warmup", s.warmup}, {"total", s.total},
                         {"next_lr", s.at(trainer.steps_done())}}},
        {"optimizer", {{"name", "adamw"}, {"beta1", c.adamw.beta1}, {"beta2", c.adamw.beta2},
                       {"epsilon", c.adamw.epsilon}, {"weight_decay", c.adamw.weight_decay}, {"clip", c.clip}}},
        {"data", {{"dataset", trainer.dataset().describe()}, {"path", c.data}, {"digits", c.digits},
                  {"seed", c.seed}, {"next_sample", trainer.consumed_samples()}}},
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
  SW_CHECK(trainer.pipeline() == nullptr,
           "loading a checkpoint into a pipeline-parallel run (mesh {}) is not supported yet",
           trainer.strategy().mesh.to_string());
  nlohmann::json saved = ckpt::load_json(dir, "config.json"), mine = model_config(trainer.config());
  std::vector<std::string> differ;
  for (const char* key : {"n_layer", "n_head", "n_embd", "n_positions", "vocab_size"}) {
    if (saved.value(key, nlohmann::json()) != mine[key])
      differ.push_back(fmt::format("{} {} (checkpoint) vs {} (this run)", key, saved.value(key, nlohmann::json()).dump(),
                                   mine[key].dump()));
  }
  SW_CHECK(differ.empty(), "checkpoint {} holds another model: {}", dir.string(), fmt::join(differ, ", "));
  const int64_t me = world.members()[static_cast<size_t>(world.rank())];
  std::vector<ckpt::LoadSpec> model, optimizer;
  for (ParamState& p : trainer.params()) {
    Shape global = trainer.param_shape(p.name);
    model.push_back({p.name, global, DType::F32, layout_of(trainer, p)});
    optimizer.push_back({p.name + "/exp_avg", global, DType::F32, layout_of(trainer, p)});
    optimizer.push_back({p.name + "/exp_avg_sq", global, DType::F32, layout_of(trainer, p)});
  }
  // Masters when the checkpoint has them (lower-precision weights), else the weights themselves.
  bool has_masters = ckpt::fs::exists(dir / "master_weights.safetensors.index.json");
  auto weights = ckpt::load_group(dir, has_masters ? "master_weights" : "model", model, me);
  auto moments = ckpt::load_group(dir, "optimizer", optimizer, me);
  for (ParamState& p : trainer.params()) {
    const Tensor& w = weights.at(p.name);
    std::copy(w.data<float>(), w.data<float>() + w.numel(), p.master.data<float>());
    if (p.param.raw() != p.master.raw()) p.param = p.master.to(p.param.dtype());
    const Tensor &m = moments.at(p.name + "/exp_avg"), &v = moments.at(p.name + "/exp_avg_sq");
    std::copy(m.data<float>(), m.data<float>() + m.numel(), p.exp_avg.data<float>());
    std::copy(v.data<float>(), v.data<float>() + v.numel(), p.exp_avg_sq.data<float>());
  }
  nlohmann::json state = ckpt::load_json(dir, "trainer_state.json");
  SW_CHECK(state.value("global_batch", int64_t{0}) == trainer.config().global_batch,
           "checkpoint {} was trained with a global batch of {} sequences, this run uses {}: the data position "
           "and the schedule would not continue the same run",
           dir.string(), state.value("global_batch", int64_t{0}), trainer.config().global_batch);
  trainer.restore_position(state.at("step").get<int64_t>(), state.at("consumed_samples").get<int64_t>());
}

CheckpointSchedule::CheckpointSchedule(ckpt::fs::path root, int64_t every, bool async, ckpt::SaveOptions options)
    : root_(std::move(root)), every_(every), options_(options) {
  if (async) async_ = std::make_unique<ckpt::AsyncSaver>(options_);
}

std::optional<ckpt::fs::path> CheckpointSchedule::after_step(Trainer& trainer, comm::Communicator& world, bool force) {
  if (!force && (every_ <= 0 || trainer.steps_done() % every_ != 0)) return std::nullopt;
  auto start = std::chrono::steady_clock::now();
  std::optional<ckpt::fs::path> dir;
  if (async_) {
    async_->save(world, root_, checkpoint_content(trainer, world));
  } else {
    dir = save_trainer(trainer, world, root_, options_);
  }
  last_blocking_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return dir;
}

std::optional<ckpt::fs::path> CheckpointSchedule::finish() {
  if (async_) return async_->finish();
  return std::nullopt;
}

}  // namespace shardwise::train
