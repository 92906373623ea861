// FP8 checkpoints against torch: tests/golden/fp8 was written by tools/fp8_golden.py (torch's
// float8_e4m3fn and transformers' own dequantisation). Every E4M3 code decodes to torch's value, our
// encoder rounds as torch's cast does, and the tiny FP8 Llama (blocks of [8, 12], ragged at the
// edges) loads dequantised bit for bit as transformers dequantises it, on any layout; a missing or
// misshapen scale is an Error naming the weight.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "shardwise/ckpt/checkpoint.h"
#include "shardwise/ckpt/fp8.h"
#include "shardwise/ckpt/group_reader.h"
#include "shardwise/ckpt/safetensors_writer.h"
#include "shardwise/ckpt/tools.h"
#include "shardwise/core/error.h"
#include "ckpt_test_util.h"

namespace shardwise::ckpt {
namespace {

using testing::ScratchDir;
using testing::Topology;
// tests/golden/fp8, beside the checkpoint fixtures (tests/ckpt/fixtures).
const fs::path kGolden = fs::path(SHARDWISE_CKPT_FIXTURES) / "../../golden/fp8";
const fs::path kModel = kGolden / "llama_fp8_tiny";

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(Fp8, EveryCodeDecodesToTorchsValue) {
  SafetensorsFile f(kGolden / "e4m3.safetensors");
  ASSERT_EQ(f.info("codes").dtype, StDType::F8_E4M3);
  const auto codes = f.data(f.info("codes"));
  const Tensor values = f.read("values");
  ASSERT_EQ(codes.size(), 256u);
  int nans = 0;
  for (size_t i = 0; i < 256; ++i) {
    const auto code = static_cast<uint8_t>(codes[i]);
    const float want = values.data<float>()[i], got = e4m3_to_f32(code);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << int(code);
      ++nans;
      continue;
    }
    EXPECT_EQ(bits(got), bits(want)) << "code " << int(code) << ": " << got << " vs torch " << want;
  }
  EXPECT_EQ(nans, 2);  // S.1111.111 only
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), 0x1p-9f);  // the smallest subnormal
}

TEST(Fp8, EncodingRoundsAndSaturatesAsTorchsCastAfterAClamp) {
  SafetensorsFile f(kGolden / "e4m3.safetensors");
  const Tensor in = f.read("encode_in");
  const auto out = f.data(f.info("encode_out"));
  for (int64_t i = 0; i < in.numel(); ++i) {
    const float x = in.data<float>()[i];
    EXPECT_EQ(int(f32_to_e4m3(x)), int(static_cast<uint8_t>(out[static_cast<size_t>(i)]))) << x;
  }
  for (int c = 0; c < 256; ++c) {  // every finite code is its own encoding
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(int(f32_to_e4m3(e4m3_to_f32(static_cast<uint8_t>(c)))), c);
  }
  EXPECT_EQ(int(f32_to_e4m3(NAN)), 0x7F);
}

TEST(Fp8, TheBlockSizeComesFromConfigJson) {
  const Fp8Block b = fp8_block_of(kModel);
  EXPECT_EQ(b.rows, 8);
  EXPECT_EQ(b.cols, 12);
  ScratchDir d("fp8cfg");
  EXPECT_EQ(fp8_block_of(d.path).rows, 128);  // no config.json: the default
  std::ofstream(d.path / "config.json") << R"({"quantization_config": {"quant_method": "awq", "bits": 4}})";
  try {
    fp8_block_of(d.path);
    FAIL() << "an AWQ config was read as FP8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("quant_method \"fp8\""), std::string::npos) << e.what();
  }
}

std::vector<LoadSpec> specs_of(const SafetensorsFile& want, const Topology& topo, bool range = false) {
  std::vector<LoadSpec> specs;
  for (const StTensorInfo& t : want.tensors()) {
    const reshard::Layout l = testing::layout_of(topo, t.name);
    specs.push_back({t.name, t.shape, DType::F32, l});
    if (range && t.shape.ndim() == 2) specs.back().range = FlatRange{3, 17};
  }
  return specs;
}

// The tiny FP8 Llama read whole, in column and row blocks across block edges (tp=3 over 16 rows:
// 6, 5, 5), and as flat ranges of blocks: every element as transformers dequantised it.
TEST(Fp8, LoadingDequantisesAsTransformersDoesOnAnyLayout) {
  SafetensorsFile want(kGolden / "llama_fp8_tiny_dequant.safetensors");
  GroupReader reader(kModel, "model");
  int fp8 = 0;
  for (const StTensorInfo& t : want.tensors()) fp8 += reader.info(t.name).dtype == StDType::F8_E4M3;
  EXPECT_EQ(fp8, 14);  // seven linear weights in each of 2 layers
  LoadOptions o;
  for (const Topology& topo : {Topology{"one", "1", {{"*", "R"}}}, Topology{"rows", "tp=3", {{"*", "S(0)"}}},
                               Topology{"cols", "tp=3", {{"*", "R"}, {"model.layers.0.mlp.down_proj.weight", "S(1)"},
                                                         {"model.layers.1.self_attn.q_proj.weight", "S(1)"}}}}) {
    for (bool range : {false, true}) {
      if (range && topo.label != "one") continue;
      const std::vector<LoadSpec> specs = specs_of(want, topo, range);
      for (int64_t p = 0; p < mesh::parse_mesh(topo.mesh).size(); ++p) {
        auto got = load_group(kModel, "model", specs, p, o);
        for (const LoadSpec& s : specs) {
          Tensor whole = want.read(s.name);
          const int64_t start = 3;
          Tensor expect = s.range ? whole.reshaped(Shape{whole.numel()}).slice({&start, 1}, Shape{17})
                                : testing::block_of(whole, s.layout, p);
          EXPECT_TRUE(testing::bit_equal(got.at(s.name), expect)) << topo.label << " " << s.name << " " << p;
        }
      }
    }
  }
}

// Copies the fixture's tensors into `dir`/model.safetensors, but for `drop` (left out) and `replace`
// (`with` instead: under a new name when `replace` is not in the fixture).
void write_variant(const fs::path& dir, const std::string& drop, const std::string& replace, const Tensor& with) {
  SafetensorsFile src(kModel / "model.safetensors");
  std::vector<StEntry> entries;
  for (const StTensorInfo& t : src.tensors()) {
    if (t.name == drop) continue;
    if (t.name == replace) entries.push_back(entry_of(t.name, with));
    else entries.push_back({{t.name, t.dtype, t.shape}, src.data(t)});
  }
  if (!replace.empty() && !src.header().find(replace)) entries.push_back(entry_of(replace, with));
  write_safetensors(dir / "model.safetensors", entries);
  fs::copy_file(kModel / "config.json", dir / "config.json");
}

std::string load_error(const fs::path& dir) {
  SafetensorsFile want(kGolden / "llama_fp8_tiny_dequant.safetensors");
  try {
    load_group(dir, "model", specs_of(want, {"one", "1", {{"*", "R"}}}), 0);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Fp8, AMissingOrMisshapenScaleNamesTheWeight) {
  const std::string w = "model.layers.1.mlp.down_proj.weight";  // [16, 32]: scales [2, 3]
  {
    ScratchDir d("fp8miss");
    write_variant(d.path, w + "_scale_inv", "", Tensor());
    const std::string e = load_error(d.path);
    EXPECT_NE(e.find("FP8 weight '" + w + "'"), std::string::npos) << e;
    EXPECT_NE(e.find("scales are missing"), std::string::npos) << e;
  }
  {
    ScratchDir d("fp8shape");
    write_variant(d.path, "", w + "_scale_inv", Tensor(DType::F32, Shape{2, 2}));
    const std::string e = load_error(d.path);
    EXPECT_NE(e.find("FP8 weight '" + w + "'"), std::string::npos) << e;
    EXPECT_NE(e.find("expected 2x3"), std::string::npos) << e;
  }
  {  // a scale whose weight is not FP8 is a tensor like any other: unexpected
    ScratchDir d("fp8stray");
    write_variant(d.path, "", "model.norm.weight_scale_inv", Tensor(DType::F32, Shape{1}));
    const std::string e = load_error(d.path);
    EXPECT_NE(e.find("not asked for (1): 'model.norm.weight_scale_inv'"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace shardwise::ckpt

namespace shardwise::ckpt {
namespace {

const fs::path kLlama = fs::path(SHARDWISE_CKPT_FIXTURES) / "../../golden/hf/llama_tiny";

TEST(Fp8Convert, ToF32DequantisesAsTransformersDoesAndDropsTheScales) {
  ScratchDir d("fp8tof32");
  RewriteOptions o;
  o.dtype = DType::F32;
  merge_checkpoint(kModel, d.path / "out", o);
  SafetensorsFile want(kGolden / "llama_fp8_tiny_dequant.safetensors");
  GroupReader got(d.path / "out", "model");
  EXPECT_EQ(got.names().size(), want.tensors().size());  // no *_scale_inv
  for (const StTensorInfo& t : want.tensors()) {
    EXPECT_TRUE(testing::bit_equal(got.file_of(t.name).read(t.name), want.read(t.name))) << t.name;
  }
  const nlohmann::json config = load_json(d.path / "out", "config.json");
  EXPECT_FALSE(config.contains("quantization_config"));
  EXPECT_EQ(config["torch_dtype"], "float32");
}

// llama_tiny quantised by shardwise equals the fixture torch quantised from it by transformers'
// formula (tools/fp8_golden.py), byte for byte: the codes, the scales, the kept tensors.
TEST(Fp8Convert, ToFp8WritesTorchsCodesAndScales) {
  ScratchDir d("fp8write");
  RewriteOptions o;
  o.fp8_e4m3 = true;
  o.fp8_block = {8, 12};
  merge_checkpoint(kLlama, d.path / "out", o);
  GroupReader got(d.path / "out", "model"), want(kModel, "model");
  ASSERT_EQ(got.names(), want.names());
  for (const std::string& n : want.names()) {
    const StTensorInfo &g = got.info(n), &w = want.info(n);
    EXPECT_EQ(st_dtype_name(g.dtype), st_dtype_name(w.dtype)) << n;
    EXPECT_EQ(g.shape, w.shape) << n;
    const auto a = got.file_of(n).data(g), b = want.file_of(n).data(w);
    EXPECT_TRUE(a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0) << n;
  }
  const nlohmann::json config = load_json(d.path / "out", "config.json");
  EXPECT_EQ(config["quantization_config"], load_json(kModel, "config.json")["quantization_config"]);
}

// The default [128, 128] blocks, read back (load_group): every element within E4M3's rounding of the
// original, |w' - w| <= 2^-4 |w| (3 mantissa bits, round to nearest), plus half the subnormal step
// 2^-10 in the block's units (amax / 448) and the f32 rounding of the scale: at most 2^-4 of the
// block's amax.
TEST(Fp8Convert, RoundTripIsWithinTheE4m3Bound) {
  ScratchDir d("fp8trip");
  RewriteOptions o;
  o.fp8_e4m3 = true;
  merge_checkpoint(kLlama, d.path / "out", o);
  EXPECT_EQ(fp8_block_of(d.path / "out").rows, 128);
  GroupReader src(kLlama, "model"), out(d.path / "out", "model");
  std::vector<LoadSpec> specs;
  for (const std::string& n : src.names()) specs.push_back({n, src.info(n).shape, DType::F32, {mesh::parse_mesh("1"), mesh::parse_dist("R", 1)}});
  auto back = load_group(d.path / "out", "model", specs, 0);
  int quantised = 0;
  for (const std::string& n : src.names()) {
    const Tensor w = src.file_of(n).read(n).to(DType::F32), r = back.at(n);
    if (out.info(n).dtype != StDType::F8_E4M3) {
      EXPECT_TRUE(testing::bit_equal(w, r)) << n;  // embeddings, head and norms kept
      continue;
    }
    ++quantised;
    float amax = 0;
    for (int64_t i = 0; i < w.numel(); ++i) amax = std::max(amax, std::fabs(w.data<float>()[i]));
    bool changed = false;
    for (int64_t i = 0; i < w.numel(); ++i) {
      const float a = w.data<float>()[i], b = r.data<float>()[i];
      EXPECT_LE(std::fabs(a - b), 0x1p-4f * std::fabs(a) * (1 + 1e-6f) + amax * 0x1p-18f) << n << "[" << i << "]";
      changed |= a != b;
    }
    EXPECT_TRUE(changed) << n;
  }
  EXPECT_EQ(quantised, 14);
}

TEST(Fp8Convert, AGpt2HasNoLinearWeightsToQuantise) {
  ScratchDir d("fp8gpt");
  RewriteOptions o;
  o.fp8_e4m3 = true;
  try {
    merge_checkpoint(fs::path(SHARDWISE_CKPT_FIXTURES) / "../../golden/hf/gpt2_tiny", d.path / "out", o);
    FAIL() << "GPT-2 was quantised";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no linear weights to quantise"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(d.path / "out"));
}

}  // namespace
}  // namespace shardwise::ckpt
