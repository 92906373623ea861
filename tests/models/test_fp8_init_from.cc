// `--init-from` an FP8 model (tests/golden/fp8/llama_fp8_tiny, tools/fp8_golden.py: the tiny
// transformers Llama with its linear weights in F8_E4M3 and block scales): the first step's loss is
// exactly that of the same model in f32 as transformers dequantises it, on one rank and on meshes that
// cut the weights across the scale blocks; and it differs from the unquantised model's loss.
#include <gtest/gtest.h>

#include <filesystem>

#include "shardwise/train/checkpointing.h"
#include "tests/support/llama_config.h"
#include "tests/support/train_losses.h"

namespace shardwise::train {
namespace {

namespace fs = std::filesystem;
const fs::path kFp8 = fs::path(SHARDWISE_SOURCE_DIR) / "tests/golden/fp8";
const fs::path kHf = fs::path(SHARDWISE_SOURCE_DIR) / "tests/golden/hf";

double first_loss(const std::string& mesh, const fs::path& from) {
  return init_from_first_loss(golden_fine_tune(from.string(), (kHf / "llama_tokens.bin").string(), mesh), from);
}

TEST(Fp8InitFrom, TrainsFromTheDequantisedWeights) {
  // The f32 model transformers dequantised: its config without quantization_config.
  const fs::path f32 = fs::temp_directory_path() / "sw_fp8_dequantised";
  fs::remove_all(f32);
  fs::create_directories(f32);
  fs::copy_file(kHf / "llama_tiny/config.json", f32 / "config.json");
  fs::copy_file(kFp8 / "llama_fp8_tiny_dequant.safetensors", f32 / "model.safetensors");
  const double want = first_loss("dp=1", f32);
  EXPECT_NE(want, first_loss("dp=1", kHf / "llama_tiny"));  // quantisation changed the weights
  for (const std::string mesh : {"dp=1", "tp=2", "dp=2,tp=2"}) {
    EXPECT_EQ(first_loss(mesh, kFp8 / "llama_fp8_tiny"), first_loss(mesh, f32)) << mesh;
  }
  fs::remove_all(f32);
}

}  // namespace
}  // namespace shardwise::train
