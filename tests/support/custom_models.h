#pragma once
// Models built outside the built-in builders (models/custom.h) that the custom-model tests train:
// GPT-2 through the custom path (its reference: the built-in GPT-2, bit for bit) and a least-squares
// model fed batches by the caller (its reference: the exact formula).
#include <cmath>
#include <map>
#include <memory>
#include <string>

#include "shardwise/models/custom.h"
#include "shardwise/models/models.h"

namespace shardwise::train {

// GPT-2 through the custom path: its graph by build_gpt (on the run's config without the custom
// model), its initial values by name as init_param_block draws them for `gpt`'s layers and std.
inline std::shared_ptr<const CustomModel> gpt_as_custom(const GptConfig& gpt, int* builds) {
  auto custom = std::make_shared<CustomModel>();
  custom->description = "GPT-2 through CustomModel";
  custom->build = [builds](const GptConfig& config, const Strategy& s, int64_t sequences, bool training,
                           const GptPart& part) {
    ++*builds;
    GptConfig c = config;
    c.custom = nullptr;
    c.head_grads_in_forward = training;
    return build_gpt(c, s, sequences, true, part);
  };
  custom->tied = [] { return std::string("transformer.wte.weight"); };
  custom->init = [gpt](const std::string& name) {
    if (name.ends_with(".bias")) return ParamInit{0, 0};
    if (name.find(".ln_") != std::string::npos) return ParamInit{0, 1};
    const double proj = name.ends_with("c_proj.weight") ? std::sqrt(2.0 * static_cast<double>(gpt.layers)) : 1.0;
    return ParamInit{gpt.init_std / proj, 0};
  };
  custom->constants = [] { return std::map<std::string, Tensor>{}; };
  return custom;
}

// Least squares fed from the caller: x [B, 3] and y [B, 1] (f32, rows S(0) over dp), w [3, 1]
// initialised to 0.5, loss mean((x w - y)^2). The batch: x[i][j] = i + j / 4, y[i] = i / 2 - 1.
inline std::shared_ptr<const CustomModel> fed_least_squares(int64_t rows) {
  auto custom = std::make_shared<CustomModel>();
  custom->description = "least squares fed x and y";
  custom->build = [](const GptConfig&, const Strategy& s, int64_t sequences, bool, const GptPart&) {
    GptGraph out;
    graph::Graph& g = out.g;
    const std::string rows = s.dp >= 0 ? "S(0)" : "R";
    auto x = g.input("x", Shape{sequences, 3}), y = g.input("y", Shape{sequences, 1});
    g.annotate(x, rows);
    g.annotate(y, rows);
    auto error = g.op1("subtract", {g.op1("matmul", {x, g.param("w", Shape{3, 1})}), y});
    out.loss = g.op1("mean", {g.op1("multiply", {error, error})});
    return out;
  };
  custom->tied = [] { return std::string(); };
  custom->init = [](const std::string&) { return ParamInit{0, 0.5}; };
  custom->constants = [] { return std::map<std::string, Tensor>{}; };
  custom->feeds = {"x", "y"};
  Tensor x(DType::F32, Shape{rows, 3}), y(DType::F32, Shape{rows, 1});
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < 3; ++j) x.data<float>()[i * 3 + j] = static_cast<float>(i) + static_cast<float>(j) / 4;
    y.data<float>()[i] = static_cast<float>(i) / 2 - 1;
  }
  custom->batch = [x, y](const std::string& name) { return name == "x" ? x : y; };
  return custom;
}

}  // namespace shardwise::train
