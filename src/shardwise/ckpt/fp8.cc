#include "shardwise/ckpt/fp8.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "shardwise/ckpt/checkpoint.h"
#include "shardwise/ckpt/group_reader.h"
#include "shardwise/core/error.h"

namespace shardwise::ckpt {

float e4m3_to_f32(uint8_t code) {
  const bool negative = (code & 0x80) != 0;
  const int exponent = (code >> 3) & 0xF, mantissa = code & 0x7;
  if (exponent == 0xF && mantissa == 0x7) return std::numeric_limits<float>::quiet_NaN();
  const float magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)  // subnormal: m/8 * 2^-6
                                        : std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);
  return negative ? -magnitude : magnitude;
}

uint8_t f32_to_e4m3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | 0x7F;
  const float a = std::fabs(x);
  if (a >= 448.0f) return sign | 0x7E;
  if (a < 0x1p-6f) {  // subnormal: multiples of 2^-9; 8 of them is the smallest normal, code 0x08
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  int e = 0;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1): a / 2^(e-1) in [1, 2)
  int exponent = e - 1;
  int mantissa = static_cast<int>(std::nearbyint((std::ldexp(a, -exponent) - 1.0f) * 8.0f));  // exact, then RNE
  if (mantissa == 8) ++exponent, mantissa = 0;
  const int code = std::min(((exponent + 7) << 3) | mantissa, 0x7E);
  return sign | static_cast<uint8_t>(code);
}

Fp8Block fp8_block_of(const fs::path& dir) {
  Fp8Block block;
  if (!fs::is_regular_file(dir / "config.json")) return block;
  const nlohmann::json config = load_json(dir, "config.json");
  if (!config.contains("quantization_config") || config["quantization_config"].is_null()) return block;
  const nlohmann::json& q = config["quantization_config"];
  const std::string where = (dir / "config.json").string();
  SW_CHECK(q.is_object() && q.value("quant_method", "") == "fp8",
           "'{}': quantization_config {} is not FP8 with block scales (quant_method \"fp8\"): shardwise reads only "
           "F8_E4M3 weights with weight_scale_inv", where, q.dump());
  if (!q.contains("weight_block_size") || q["weight_block_size"].is_null()) return block;
  const nlohmann::json& b = q["weight_block_size"];
  SW_CHECK(b.is_array() && b.size() == 2 && b[0].is_number_integer() && b[1].is_number_integer() &&
               b[0].get<int64_t>() > 0 && b[1].get<int64_t>() > 0,
           "'{}': quantization_config.weight_block_size must be two positive integers, got {}", where, b.dump());
  return {b[0].get<int64_t>(), b[1].get<int64_t>()};
}

nlohmann::json fp8_quantization_config(Fp8Block block) {
  return {{"activation_scheme", "dynamic"},
          {"fmt", "e4m3"},
          {"quant_method", "fp8"},
          {"weight_block_size", {block.rows, block.cols}}};
}

std::string fp8_scale_key(std::string_view weight_key) { return std::string(weight_key) + "_scale_inv"; }

std::optional<std::string> fp8_weight_of_scale(const GroupReader& reader, const std::string& name) {
  constexpr std::string_view kSuffix = "_scale_inv";
  if (!name.ends_with(kSuffix)) return std::nullopt;
  std::string weight = name.substr(0, name.size() - kSuffix.size());
  if (!reader.contains(weight) || reader.info(weight).dtype != StDType::F8_E4M3) return std::nullopt;
  return weight;
}

namespace {

int64_t blocks(int64_t n, int64_t b) { return (n + b - 1) / b; }

// The scale of F8 weight `key`, as f32, checked against the weight's shape.
Tensor scale_of(const GroupReader& reader, const std::string& key, const Shape& shape, Fp8Block block) {
  SW_CHECK(shape.ndim() == 2, "FP8 weight '{}' has shape {}: only 2-D weights with block scales are read", key,
           shape.to_string());
  const std::string scale = fp8_scale_key(key);
  SW_CHECK(reader.contains(scale), "FP8 weight '{}' ({}) has no '{}' beside it: its scales are missing", key,
           reader.file_name_of(key), scale);
  const StTensorInfo& info = reader.info(scale);
  const Shape want{blocks(shape[0], block.rows), blocks(shape[1], block.cols)};
  SW_CHECK(info.shape == want,
           "FP8 weight '{}' {}: its '{}' has shape {}, expected {} (one scale per block of [{}, {}], "
           "quantization_config.weight_block_size)", key, shape.to_string(), scale, info.shape.to_string(),
           want.to_string(), block.rows, block.cols);
  auto dtype = to_tensor_dtype(info.dtype);
  SW_CHECK(dtype && is_floating(*dtype), "FP8 weight '{}': its '{}' is {}, not a floating dtype", key, scale,
           st_dtype_name(info.dtype));
  return reader.file_of(scale).read(scale).to(DType::F32);
}

}  // namespace

Tensor read_key_box(const GroupReader& reader, const std::string& key, const reshard::Box& box, Fp8Block block) {
  const SafetensorsFile& file = reader.file_of(key);
  const StTensorInfo& info = file.info(key);
  if (info.dtype != StDType::F8_E4M3) return file.read_box(key, box);
  const Tensor scale = scale_of(reader, key, info.shape, block);
  SW_CHECK(box.shape.ndim() == 2 && box.offset[0] >= 0 && box.offset[1] >= 0 &&
               box.offset[0] + box.shape[0] <= info.shape[0] && box.offset[1] + box.shape[1] <= info.shape[1],
           "FP8 weight '{}' {}: box {} at [{}, {}] is out of range", key, info.shape.to_string(), box.shape.to_string(),
           box.offset[0], box.offset[1]);
  // The codes straight from the mapping: one byte per element, row by row of the box.
  const auto* q = reinterpret_cast<const uint8_t*>(file.data(info).data());
  Tensor out(DType::F32, box.shape);
  const float* s = scale.data<float>();
  float* w = out.data<float>();
  const int64_t rows = box.shape[0], cols = box.shape[1], scale_cols = scale.shape()[1], stride = info.shape[1];
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t r = box.offset[0] + i;
    const float* srow = s + r / block.rows * scale_cols;
    const uint8_t* qrow = q + r * stride + box.offset[1];
    for (int64_t j = 0; j < cols; ++j) w[i * cols + j] = e4m3_to_f32(qrow[j]) * srow[(box.offset[1] + j) / block.cols];
  }
  return out;
}

Fp8Weight fp8_quantize(const Tensor& weight, Fp8Block block) {
  SW_CHECK(weight.ndim() == 2 && weight.dtype() == DType::F32, "fp8_quantize: a 2-D f32 weight, got {} {}",
           dtype_name(weight.dtype()), weight.shape().to_string());
  const int64_t rows = weight.shape()[0], cols = weight.shape()[1];
  Fp8Weight out{std::vector<uint8_t>(static_cast<size_t>(rows * cols)),
                Tensor(DType::F32, Shape{blocks(rows, block.rows), blocks(cols, block.cols)})};
  const float* w = weight.data<float>();
  float* inv = out.scale_inv.data<float>();
  for (int64_t bi = 0; bi < blocks(rows, block.rows); ++bi) {
    for (int64_t bj = 0; bj < blocks(cols, block.cols); ++bj) {
      const int64_t r0 = bi * block.rows, r1 = std::min(rows, r0 + block.rows);
      const int64_t c0 = bj * block.cols, c1 = std::min(cols, c0 + block.cols);
      float amax = 0;
      for (int64_t i = r0; i < r1; ++i)
        for (int64_t j = c0; j < c1; ++j) amax = std::max(amax, std::fabs(w[i * cols + j]));
      const float scale = amax > 0 ? 448.0f / amax : 1.0f;
      inv[bi * blocks(cols, block.cols) + bj] = 1.0f / scale;
      for (int64_t i = r0; i < r1; ++i)
        for (int64_t j = c0; j < c1; ++j) out.codes[static_cast<size_t>(i * cols + j)] = f32_to_e4m3(w[i * cols + j] * scale);
    }
  }
  return out;
}

}  // namespace shardwise::ckpt
