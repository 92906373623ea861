#pragma once
// FP8 weights as published checkpoints store them (DeepSeek-V3, the Qwen FP8 releases): a linear
// weight "<module>.weight" in F8_E4M3 and beside it "<module>.weight_scale_inv", F32 of shape
// [ceil(rows / b0), ceil(cols / b1)], one scale per block of [b0, b1] = config.json's
// quantization_config.weight_block_size (default [128, 128], quant_method "fp8"):
//   w[i, j] = e4m3_to_f32(q[i, j]) * scale_inv[i / b0, j / b1]
// E4M3 is the OCP "e4m3fn" format (torch.float8_e4m3fn): sign, 4 exponent bits of bias 7, 3 mantissa
// bits, subnormals, no infinities, S.1111.111 the only NaN; the largest finite value is 448.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardwise/ckpt/file_io.h"
#include "shardwise/reshard/blocks.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::ckpt {

class GroupReader;

float e4m3_to_f32(uint8_t code);
// Round to nearest, ties to even; saturates to +-448 (as a clamp before torch's cast does); NaN
// becomes S.1111.111.
uint8_t f32_to_e4m3(float x);

struct Fp8Block {
  int64_t rows = 128, cols = 128;
};

// config.json's quantization_config block size (`dir` holds config.json): [128, 128] when the file,
// the section or weight_block_size is absent. Error naming the file when the section's quant_method
// is not "fp8" (another scheme's scales mean something else) or the block size is not two positive
// integers.
Fp8Block fp8_block_of(const fs::path& dir);
// The quantization_config that `ckpt convert --dtype f8-e4m3` writes, as the Qwen FP8 and
// DeepSeek-V3 releases write it.
nlohmann::json fp8_quantization_config(Fp8Block block);

std::string fp8_scale_key(std::string_view weight_key);  // "<key>_scale_inv"
// "<key>" for "<key>_scale_inv" when the reader holds "<key>" as F8_E4M3 (the scale is a part of
// that weight); nullopt for any other name.
std::optional<std::string> fp8_weight_of_scale(const GroupReader& reader, const std::string& name);

// The block `box` (coordinates of stored tensor `key`) as stored, or, for an F8_E4M3 weight,
// dequantised to f32 by its scale. Error naming the weight when it is not 2-D, its scale is missing,
// not floating, or not of shape [ceil(rows / b0), ceil(cols / b1)].
Tensor read_key_box(const GroupReader& reader, const std::string& key, const reshard::Box& box, Fp8Block block);

// The codes and scales of a 2-D f32 weight, per block of `block` (blocks at the right and bottom
// edges may be smaller): amax of the block, scale = 448 / amax (1 for an all-zero block),
// q = f32_to_e4m3(w * scale), scale_inv = 1 / scale, as transformers' Fp8Quantize computes them.
struct Fp8Weight {
  std::vector<uint8_t> codes;  // row-major, one byte per element
  Tensor scale_inv;            // F32 [ceil(rows / b0), ceil(cols / b1)]
};
Fp8Weight fp8_quantize(const Tensor& weight, Fp8Block block);

}  // namespace shardwise::ckpt
