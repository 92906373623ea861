#include "shardwise/train/model_io.h"

#include "shardwise/core/error.h"

namespace shardwise::train {

GptConfig read_model_config(const ckpt::fs::path& dir) {
  nlohmann::json j = ckpt::load_json(dir, "config.json");
  auto field = [&](const char* key) {
    SW_CHECK(j.contains(key) && j[key].is_number_integer(), "'{}': config.json has no integer '{}'",
             (dir / "config.json").string(), key);
    return j[key].get<int64_t>();
  };
  GptConfig c;
  c.layers = field("n_layer");
  c.heads = field("n_head");
  c.hidden = field("n_embd");
  c.seq = field("n_positions");
  c.vocab = field("vocab_size");
  c.layer_norm_epsilon = j.value("layer_norm_epsilon", c.layer_norm_epsilon);
  c.init_std = j.value("initializer_range", c.init_std);
  c.validate();
  return c;
}

std::map<std::string, Tensor> load_model_weights(const ckpt::fs::path& dir, const GptConfig& config,
                                                 std::span<const ckpt::LoadSpec> specs, int64_t process,
                                                 const std::vector<std::string>& ignore_keys) {
  const bool masters = ckpt::fs::exists(dir / "master_weights.safetensors.index.json");
  ckpt::LoadOptions o;
  o.ignore_keys = ignore_keys;
  o.convert_dtype = true;
  return ckpt::load_group(dir, masters ? "master_weights" : "model", specs, process, o);
}

}  // namespace shardwise::train
