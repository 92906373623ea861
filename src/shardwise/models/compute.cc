#include "shardwise/models/compute.h"

namespace shardwise::train {

namespace {

graph::ValueId cast_to(graph::Graph& g, graph::ValueId v, const char* dtype, const std::string& name) {
  return g.op1("cast", {v}, {{"dtype", std::string(dtype)}}, name);
}

// The bf16 value a cast to f32 reads (-1: v is no such cast).
graph::ValueId bf16_source(const graph::Graph& g, graph::ValueId v) {
  const graph::Value& value = g.value(v);
  if (value.producer < 0) return -1;
  const graph::Node& n = g.node(value.producer);
  return n.op == "cast" && g.value(n.inputs[0]).meta.dtype == DType::BF16 ? n.inputs[0] : -1;
}

}  // namespace

bool computes_bf16(const GptConfig& config) { return config.compute_dtype == DType::BF16; }

graph::ValueId compute_operand(graph::Graph& g, const GptConfig& config, graph::ValueId v) {
  const graph::Value& value = g.value(v);
  if (!computes_bf16(config) || value.meta.dtype == DType::BF16) return v;
  if (graph::ValueId source = bf16_source(g, v); source >= 0) return source;
  const std::string name = value.name + ".bf16";
  if (auto cached = g.find(name)) return *cached;
  return cast_to(g, v, "bf16", name);
}

graph::ValueId compute_result(graph::Graph& g, graph::ValueId v, const std::string& name) {
  if (g.value(v).meta.dtype == DType::F32) return v;
  return cast_to(g, v, "f32", name);
}

graph::ValueId compute_matmul(graph::Graph& g, const GptConfig& config, graph::ValueId x, graph::ValueId y,
                              bool trans_y, const std::string& name) {
  if (!computes_bf16(config)) return g.matmul(x, y, trans_y, name);
  auto product = g.matmul(compute_operand(g, config, x), compute_operand(g, config, y), trans_y, name + ".bf16");
  return compute_result(g, product, name);
}

bool regathers_sp_inputs(const graph::Graph& g, const GptConfig& config, const Strategy& s, bool training) {
  return training && s.sequence_parallel && computes_bf16(config) && !config.lora.enabled() && g.open_segment() < 0;
}

std::string sp_norm_placements(const graph::Graph& g, const GptConfig& config, const Strategy& s, bool training) {
  return s.placements(regathers_sp_inputs(g, config, s, training) ? "S(1)" : "R", "S(0)");
}

std::vector<graph::ValueId> on_gathered(graph::Graph& g, const GptConfig& config, const Strategy& s, bool training,
                                        graph::ValueId h, bool recompute_cast,
                                        const std::function<std::vector<graph::ValueId>(graph::ValueId)>& matmuls) {
  if (!regathers_sp_inputs(g, config, s, training)) return matmuls(h);
  if (recompute_cast) g.begin_segment();
  auto cast = compute_operand(g, config, h);
  g.annotate(cast, s.placements("S(1)", "S(0)"));
  if (!recompute_cast) g.begin_segment();
  const Shape& shape = g.value(cast).meta.shape;
  auto gathered = g.reshape(cast, std::vector<int64_t>(shape.begin(), shape.end()), g.value(cast).name + ".gathered");
  g.annotate(gathered, s.placements("R", "S(0)"));
  std::vector<graph::ValueId> out = matmuls(gathered);
  g.end_segment();
  return out;
}

}  // namespace shardwise::train
