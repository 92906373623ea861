#pragma once
// The checkpoint tools behind `shardwise ckpt ...`: inspect, verify, merge, convert, lora-merge.
// merge/convert/lora-merge read the "model" group of any checkpoint (shardwise's, or a Hugging
// Face directory with model.safetensors or an index) and write a Hugging Face style checkpoint
// (index + k-of-n shards with format=pt; config.json, generation_config.json and the tokenizer
// files, kTokenizerFiles, copied; a manifest) through the same commit protocol: OUT.tmp, fsync,
// rename. OUT must not exist.
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "shardwise/ckpt/file_io.h"
#include "shardwise/ckpt/fp8.h"
#include "shardwise/core/dtype.h"

namespace shardwise::ckpt {

// A directory (manifest, groups, tensors) or one .safetensors file.
void inspect(const fs::path& path, std::ostream& out);

struct RewriteOptions {
  uint64_t max_shard_bytes = 5'000'000'000;
  std::optional<DType> dtype;               // convert floating tensors (F64/F32/F16/BF16) to this
  std::vector<std::string> remove_keys;     // glob patterns of keys left out
  // --dtype f8-e4m3 (fp8.h): the linear weights (2-D q/k/v/o_proj, gate/up/down_proj) written as
  // F8_E4M3 with a "<key>_scale_inv" per block, and config.json's quantization_config; every other
  // tensor (embeddings, head, norms, a router) kept as it is. A source in FP8 already keeps its
  // weights and its block size.
  bool fp8_e4m3 = false;
  Fp8Block fp8_block;
};
// Returns the number of tensors written. An FP8 source (F8_E4M3 weights with their scales, fp8.h)
// converted to a `dtype` is dequantised, the scales and config.json's quantization_config left out.
size_t merge_checkpoint(const fs::path& dir, const fs::path& out, const RewriteOptions& options = {});

// What --remove-keys leaves out of `path`'s model (the group merge, convert and lora-merge read: a
// directory's "model" or "adapter_model", or one .safetensors file): the keys, their bytes as stored,
// and the patterns that match no key.
struct RemovedKeys {
  std::vector<std::string> names;
  uint64_t bytes = 0;
  std::vector<std::string> unmatched;
};
RemovedKeys removed_keys(const fs::path& path, const std::vector<std::string>& patterns);

struct LoraOptions {
  double alpha = 0;   // 0: lora_alpha from the adapter's adapter_config.json
  int64_t rank = 0;   // 0: r from adapter_config.json
  // The base's layout when the caller knows it (the command reads the base's config.json: GPT-2's
  // Conv1D weights are [in, out]); it wins over adapter_config.json's fan_in_fan_out, as PEFT
  // corrects that flag by the module it adapts. nullopt: adapter_config.json's, else false.
  std::optional<bool> fan_in_fan_out;
  RewriteOptions rewrite;
};
// W + scale * B @ A for every weight W with PEFT adapter matrices "<prefix>.lora_A.weight"
// [rank, in] and "<prefix>.lora_B.weight" [out, rank] (the prefix may start with
// "base_model.model."); adapter keys are left out of the result. `adapter` is a .safetensors file or
// a directory holding adapter_model.safetensors and, as PEFT writes it, adapter_config.json, whose
// r, lora_alpha, use_rslora (scale alpha / sqrt(r) instead of alpha / r), fan_in_fan_out (W stored
// [in, out], GPT-2's Conv1D: the product is added transposed; LoraOptions::fan_in_fan_out wins) and
// target_modules (every adapted module must be one of them) are read; options given here must agree
// with it. Returns weights merged.
size_t lora_merge(const fs::path& base, const fs::path& adapter, const fs::path& out, const LoraOptions& options);

}  // namespace shardwise::ckpt
