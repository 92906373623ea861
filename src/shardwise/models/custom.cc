#include "shardwise/models/custom.h"

#include "shardwise/core/error.h"

namespace shardwise::train {

GptGraph build_custom(const GptConfig& c, const Strategy& s, int64_t sequences, bool training, const GptPart& part) {
  if (!training) {
    SW_CHECK(c.custom->predictions != nullptr, "{} has a loss graph only: predictions are not built for it",
             c.custom->description);
    GptGraph out = c.custom->predictions(c, s, sequences, part);
    out.sequences = sequences;
    return out;
  }
  // The loss-only graph (validation) is built with head_grads_in_forward off (train/staged.cc).
  GptGraph out = c.custom->build(c, s, sequences, c.head_grads_in_forward, part);
  SW_CHECK(out.loss >= 0 || !part.head, "{}: the model gave no loss", c.custom->description);
  SW_CHECK(out.output >= 0 || part.head, "{}: a pipeline stage before the last gave no output", c.custom->description);
  out.sequences = sequences;
  if (out.loss_sum < 0) out.loss_sum = out.loss;
  return out;
}

nlohmann::json custom_config_json(const GptConfig& c) {
  nlohmann::json out = c.custom->config.is_object() ? c.custom->config : nlohmann::json::object();
  out.emplace("shardwise_model", c.custom->description);
  out.emplace("max_position_embeddings", c.seq);
  out.emplace("vocab_size", c.vocab);
  return out;
}

Tensor init_custom_block(const GptConfig& c, const std::string& name, const Shape& shape,
                         std::span<const int64_t> offset, const Shape& block, uint64_t seed) {
  const ParamInit init = c.custom->init(name);
  if (init.std > 0) return normal_param_block(name, shape, offset, block, seed, init.std);
  return Tensor::full(DType::F32, block, init.value);
}

}  // namespace shardwise::train
