// The checkpoint tools: merge/convert produce Hugging Face checkpoints whose every file passes
// the format rules, lora-merge against W + (alpha/r) B A computed here by hand, verify names the
// bad file, and the `shardwise ckpt` command line.
#include <gtest/gtest.h>

#include <fstream>

#include <array>
#include <set>
#include <cstdio>
#include <sstream>

#include "ckpt_test_util.h"
#include "shardwise/ckpt/group_reader.h"
#include "shardwise/ckpt/manifest.h"
#include "shardwise/ckpt/safetensors_writer.h"
#include "shardwise/ckpt/tools.h"
#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"

namespace shardwise::ckpt {
namespace {

using namespace testing;

fs::path saved_dp2tp2(const fs::path& root) {
  SaveOptions o;
  o.max_shard_bytes = 300;
  comm::LocalWorld::run(4, [&](comm::Communicator& c) {
    save_checkpoint(c, root, content_for(small_model(), topologies()[3], c.rank(), 5), o);
  });
  return root / "checkpoint-5";
}

void expect_every_file_valid(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".safetensors") {
      EXPECT_NO_THROW(SafetensorsFile{e.path()}) << e.path();
    }
  }
  VerifyReport r = verify_checkpoint(dir);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.problems.front());
}

TEST(CkptTools, MergeWritesOneHuggingFaceCheckpointOfTheModel) {
  ScratchDir scratch("merge");
  fs::path dir = saved_dp2tp2(scratch.path);
  fs::path out = scratch.path / "merged";
  RewriteOptions o;
  o.remove_keys = {"mask"};
  EXPECT_EQ(merge_checkpoint(dir, out, o), 7u);
  expect_every_file_valid(out);
  EXPECT_TRUE(fs::exists(out / "model-00001-of-00001.safetensors"));
  EXPECT_TRUE(fs::exists(out / "config.json"));
  EXPECT_FALSE(fs::exists(out / "optimizer.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(scratch.path / "merged.tmp"));
  GroupReader g(out, "model");
  EXPECT_FALSE(g.contains("mask"));
  for (const auto& t : small_model()) {
    if (t.group == "model" && t.name != "mask") {
      EXPECT_TRUE(bit_equal(g.file_of(t.name).read(t.name), t.value)) << t.name;
    }
  }
  // Never overwrites.
  EXPECT_THROW(merge_checkpoint(dir, out), Error);
}

TEST(CkptTools, ConvertChangesFloatingTensorsOnly) {
  ScratchDir scratch("conv");
  fs::path dir = saved_dp2tp2(scratch.path);
  RewriteOptions o;
  o.dtype = DType::BF16;
  o.max_shard_bytes = 100;
  merge_checkpoint(dir, scratch.path / "bf16", o);
  expect_every_file_valid(scratch.path / "bf16");
  GroupReader g(scratch.path / "bf16", "model");
  EXPECT_GT(g.file_names().size(), 1u);
  for (const auto& t : small_model()) {
    if (t.group != "model") continue;
    Tensor got = g.file_of(t.name).read(t.name);
    if (is_floating(t.value.dtype())) {
      EXPECT_EQ(got.dtype(), DType::BF16) << t.name;
      // The formula's values are multiples of 1/8 below 13: exact in bf16.
      for (int64_t i = 0; i < t.value.numel(); ++i) EXPECT_EQ(got.at(i), t.value.at(i)) << t.name;
    } else {
      EXPECT_TRUE(bit_equal(got, t.value)) << t.name;
    }
  }
}

TEST(CkptTools, LoraMergeAddsScaledProductAndDropsAdapterKeys) {
  ScratchDir scratch("lora");
  Tensor w = Tensor::from<float>(Shape{3, 2}, std::vector<float>{1, 2, 3, 4, 5, 6});
  Tensor other = Tensor::from<float>(Shape{2}, std::vector<float>{7, 8});
  Tensor stray = Tensor::from<float>(Shape{1}, std::vector<float>{9});
  fs::create_directories(scratch.path / "base");
  std::vector<StEntry> base = {entry_of("layer.q.weight", w), entry_of("layer.q.bias", other),
                               entry_of("layer.q.lora_A.weight", stray)};
  write_safetensors(scratch.path / "base" / "model.safetensors", base, StMetadata{{"format", "pt"}});
  // rank 2: A [2, 2], B [3, 2].
  Tensor A = Tensor::from<float>(Shape{2, 2}, std::vector<float>{1, 0, 2, -1});
  Tensor B = Tensor::from<float>(Shape{3, 2}, std::vector<float>{1, 1, 0, 2, -1, 0});
  std::vector<StEntry> ad = {entry_of("base_model.model.layer.q.lora_A.weight", A),
                             entry_of("base_model.model.layer.q.lora_B.weight", B)};
  write_safetensors(scratch.path / "adapter_model.safetensors", ad);
  LoraOptions o;
  o.alpha = 4;
  o.rank = 2;
  EXPECT_EQ(lora_merge(scratch.path / "base", scratch.path / "adapter_model.safetensors", scratch.path / "out", o), 1u);
  expect_every_file_valid(scratch.path / "out");
  GroupReader g(scratch.path / "out", "model");
  EXPECT_EQ(g.names(), (std::vector<std::string>{"layer.q.bias", "layer.q.weight"}));
  // B A = [[3, -1], [4, -2], [-1, 0]]; scale 4 / 2 = 2.
  const float want[] = {1 + 6, 2 - 2, 3 + 8, 4 - 4, 5 - 2, 6 + 0};
  Tensor got = g.file_of("layer.q.weight").read("layer.q.weight");
  for (int i = 0; i < 6; ++i) EXPECT_EQ(got.data<float>()[i], want[i]) << i;
  EXPECT_EQ(load_json(scratch.path / "out", "model.safetensors.index.json")["metadata"]["total_size"], 6 * 4 + 2 * 4);
  o.rank = 3;
  EXPECT_THROW(lora_merge(scratch.path / "base", scratch.path / "adapter_model.safetensors", scratch.path / "out3", o),
               Error);
}

TEST(CkptTools, VerifyNamesTheBadFile) {
  ScratchDir scratch("verify");
  fs::path dir = saved_dp2tp2(scratch.path);
  ASSERT_TRUE(verify_checkpoint(dir).ok());
  // Same size, one byte of a shard's header changed: checksum and format both catch it.
  fs::path victim = dir / "model-00002-of-00005.safetensors";
  std::string bytes = read_text_file(victim);
  bytes[12] = '!';
  write_file_atomic(victim, bytes);
  VerifyReport r = verify_checkpoint(dir);
  ASSERT_FALSE(r.ok());
  for (const auto& p : r.problems) EXPECT_EQ(p.rfind("model-00002-of-00005.safetensors", 0), 0u) << p;
  EXPECT_GE(r.problems.size(), 2u);
  fs::remove(dir / "config.json");
  r = verify_checkpoint(dir, false);
  EXPECT_NE(std::find(r.problems.begin(), r.problems.end(), "config.json: listed in the manifest but missing"),
            r.problems.end());
}

std::pair<int, std::string> shardwise_cli(const std::string& args) {
  const char* bin = std::getenv("SHARDWISE_BIN");
  std::string cmd = std::string(bin ? bin : "shardwise") + " " + args + " 2>&1";
  std::string out;
  FILE* pipe = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf{};
  while (size_t n = fread(buf.data(), 1, buf.size(), pipe)) out.append(buf.data(), n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// `ckpt convert --dtype` takes the floating dtypes and f8-e4m3; anything else is refused naming them.
TEST(CkptTools, ConvertTakesFloatingDtypesAndFp8) {
  ScratchDir scratch("convert_dtypes");
  const std::string llama = (fs::path(SHARDWISE_CKPT_FIXTURES) / "../../golden/hf/llama_tiny").string();
  for (const char* bad : {"f8-e5m2", "i32"}) {
    auto [rc, out] = shardwise_cli("ckpt convert " + llama + " " + (scratch.path / bad).string() + " --dtype " + bad);
    EXPECT_EQ(rc, 2) << out;
    EXPECT_NE(out.find("expected f32, f16, bf16, f64 or f8-e4m3"), std::string::npos) << out;
  }
  auto [rc, out] = shardwise_cli("ckpt convert " + llama + " " + (scratch.path / "fp8").string() + " --dtype f8-e4m3");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(GroupReader(scratch.path / "fp8", "model").info("model.layers.0.mlp.up_proj.weight").dtype, StDType::F8_E4M3);
}

TEST(CkptTools, CommandLine) {
  ScratchDir scratch("cli");
  fs::path dir = saved_dp2tp2(scratch.path);
  auto [rc, out] = shardwise_cli("ckpt inspect " + dir.string());
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("step 5"), std::string::npos) << out;
  EXPECT_NE(out.find("[dp=2,tp=2] ranks 0,1,2,3"), std::string::npos) << out;
  EXPECT_NE(out.find("fc2.weight/exp_avg"), std::string::npos) << out;
  std::tie(rc, out) = shardwise_cli("ckpt verify " + dir.string());
  EXPECT_EQ(rc, 0) << out;
  std::tie(rc, out) = shardwise_cli("ckpt convert " + dir.string() + " " + (scratch.path / "c").string() +
                                    " --dtype bf16 --max-shard-size 200B");
  EXPECT_EQ(rc, 0) << out;
  std::tie(rc, out) = shardwise_cli("ckpt inspect " + (scratch.path / "c" / "model-00001-of-00003.safetensors").string());
  EXPECT_NE(out.find("BF16"), std::string::npos) << out;
  // config.json says what the converted tensors hold; its other keys are kept.
  nlohmann::json converted = load_json(scratch.path / "c", "config.json");
  EXPECT_EQ(converted["torch_dtype"], "bfloat16");
  EXPECT_EQ(converted["hidden_size"], 7);
  std::tie(rc, out) = shardwise_cli("ckpt merge " + dir.string() + " " + (scratch.path / "m").string() + " --max-shard-size 5XB");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("shardwise: error: size '5XB'"), std::string::npos) << out;
  fs::remove(dir / "model-00001-of-00005.safetensors");
  std::tie(rc, out) = shardwise_cli("ckpt verify " + dir.string());
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("bad: model-00001-of-00005.safetensors"), std::string::npos) << out;
}

// --remove-keys prints each key left out and their bytes (the source's own sizes), names a pattern
// that matches nothing, and the output index's total_size is the sum of the remaining tensors' bytes
// as the shards' headers give them.
TEST(CkptTools, RemoveKeysReportsTheBytesRemovedAndKeepsTotalSize) {
  ScratchDir scratch("remove_keys");
  fs::path dir = saved_dp2tp2(scratch.path);
  GroupReader source(dir, "model");
  uint64_t removed = 0;
  for (const std::string& n : {std::string("mask"), std::string("fc2.weight")}) removed += source.info(n).nbytes();
  const fs::path out = scratch.path / "m";
  auto [rc, text] = shardwise_cli("ckpt merge " + dir.string() + " " + out.string() +
                                  " --remove-keys mask,fc2.weight,nothing.* --max-shard-size 200B");
  ASSERT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("removed mask\n"), std::string::npos) << text;
  EXPECT_NE(text.find("removed fc2.weight\n"), std::string::npos) << text;
  EXPECT_NE(text.find(fmt::format("removed 2 tensors ({} bytes)", removed)), std::string::npos) << text;
  EXPECT_NE(text.find("note: --remove-keys 'nothing.*' matches no tensor"), std::string::npos) << text;
  const nlohmann::json index = nlohmann::json::parse(read_text_file(out / "model.safetensors.index.json"));
  std::set<std::string> files;
  for (const auto& [key, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
  uint64_t remaining = 0, kept = 0;
  for (const std::string& f : files) {
    SafetensorsFile file(out / f);
    for (const StTensorInfo& t : file.tensors()) remaining += t.nbytes(), ++kept;
  }
  EXPECT_GT(files.size(), 1u);
  EXPECT_EQ(kept, source.names().size() - 2);
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), remaining);
  EXPECT_EQ(remaining + removed, source.total_size());
}

// A file in the safetensors layout: 8-byte little-endian header length, the header, `data` bytes.
void write_safetensors(const fs::path& p, const std::string& header, size_t data) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  bytes += header + std::string(data, '\1');
  write_file_atomic(p, bytes);
}

TEST(CkptTools, InspectAndVerifyPlainFilesAndDirectories) {
  ScratchDir scratch("plain");
  fs::path hf = scratch.path / "hf";
  RewriteOptions o;
  o.max_shard_bytes = 200;
  merge_checkpoint(saved_dp2tp2(scratch.path), hf, o);
  fs::remove(hf / kManifestName);  // as a Hugging Face directory comes
  auto [rc, out] = shardwise_cli("ckpt verify " + hf.string());
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("note: no manifest.json: 1 index and"), std::string::npos) << out;
  EXPECT_NE(out.find(hf.string() + ": ok (format rules only, no checksums exist)"), std::string::npos) << out;
  fs::path shard = hf / GroupReader(hf, "model").file_names().back();
  std::tie(rc, out) = shardwise_cli("ckpt verify " + shard.string());
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("a single safetensors file: format rules checked, no checksums exist"), std::string::npos) << out;
  // A broken header is found without a manifest too.
  std::string bytes = read_text_file(shard);
  bytes[12] = '!';
  write_file_atomic(shard, bytes);
  std::tie(rc, out) = shardwise_cli("ckpt verify " + hf.string());
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("bad: " + shard.filename().string()), std::string::npos) << out;
  // The unsigned dtypes of the format are read (as raw bytes) and shown.
  fs::path u = scratch.path / "unsigned.safetensors";
  write_safetensors(u, R"({"a":{"dtype":"U16","shape":[2],"data_offsets":[0,4]},"b":{"dtype":"U32","shape":[1],)"
                       R"("data_offsets":[4,8]},"c":{"dtype":"U64","shape":[1],"data_offsets":[8,16]}})", 16);
  std::tie(rc, out) = shardwise_cli("ckpt inspect " + u.string());
  EXPECT_EQ(rc, 0) << out;
  for (const char* d : {"U16", "U32", "U64"}) EXPECT_NE(out.find(d), std::string::npos) << out;
  std::tie(rc, out) = shardwise_cli("ckpt verify " + u.string());
  EXPECT_EQ(rc, 0) << out;
  // A directory without safetensors files is no checkpoint.
  fs::create_directories(scratch.path / "empty");
  write_file_atomic(scratch.path / "empty" / "notes.txt", "x");
  std::tie(rc, out) = shardwise_cli("ckpt inspect " + (scratch.path / "empty").string());
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("holds no manifest.json and no safetensors files: not a checkpoint"), std::string::npos) << out;
  std::tie(rc, out) = shardwise_cli("ckpt verify " + (scratch.path / "empty").string());
  EXPECT_EQ(rc, 1) << out;
}

}  // namespace
}  // namespace shardwise::ckpt

namespace shardwise::ckpt {
namespace {

// A PEFT adapter directory: adapter_model.safetensors and adapter_config.json.
void write_adapter(const fs::path& dir, const std::string& module, const Tensor& A, const Tensor& B,
                   const std::string& config) {
  fs::create_directories(dir);
  std::vector<StEntry> ad = {entry_of("base_model.model." + module + ".lora_A.weight", A),
                             entry_of("base_model.model." + module + ".lora_B.weight", B)};
  write_safetensors(dir / "adapter_model.safetensors", ad);
  std::ofstream(dir / "adapter_config.json") << config;
}

float at(const Tensor& t, int64_t i) { return t.data<float>()[i]; }

// GPT-2's Conv1D stores W as [in, out]; PEFT records fan_in_fan_out and its B A is [out, in], so
// the merge adds (B A)^T. The square case is the one a wrong orientation passes silently.
TEST(CkptTools, LoraMergeReadsAdapterConfigAndAddsTheProductTransposedForConv1D) {
  ScratchDir scratch("lora_conv1d");
  // W [in 2, out 2] (square), A [r 1, in 2], B [out 2, r 1]: B A = [[1*3, 1*4], [2*3, 2*4]] = [[3, 4], [6, 8]].
  Tensor w = Tensor::from<float>(Shape{2, 2}, std::vector<float>{10, 20, 30, 40});
  Tensor A = Tensor::from<float>(Shape{1, 2}, std::vector<float>{3, 4});
  Tensor B = Tensor::from<float>(Shape{2, 1}, std::vector<float>{1, 2});
  fs::create_directories(scratch.path / "base");
  std::vector<StEntry> base = {entry_of("h.0.attn.c_proj.weight", w)};
  write_safetensors(scratch.path / "base" / "model.safetensors", base, StMetadata{{"format", "pt"}});
  write_adapter(scratch.path / "adapter", "h.0.attn.c_proj", A, B,
                R"({"r": 1, "lora_alpha": 2, "fan_in_fan_out": true, "target_modules": ["c_attn", "c_proj"]})");
  LoraOptions o;  // rank and alpha from adapter_config.json: scale 2 / 1
  EXPECT_EQ(lora_merge(scratch.path / "base", scratch.path / "adapter", scratch.path / "out", o), 1u);
  Tensor got = GroupReader(scratch.path / "out", "model").file_of("h.0.attn.c_proj.weight").read("h.0.attn.c_proj.weight");
  // W[i][o] += 2 * (B A)[o][i]: (B A)^T = [[3, 6], [4, 8]].
  const float want[] = {10 + 6, 20 + 12, 30 + 8, 40 + 16};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(at(got, i), want[i]) << i;
  o.rank = 2;  // options that disagree with adapter_config.json are refused
  EXPECT_THROW(lora_merge(scratch.path / "base", scratch.path / "adapter", scratch.path / "out2", o), Error);
}

TEST(CkptTools, LoraMergeRefusesAdaptersOutsideTargetModulesAndUnsupportedPatterns) {
  ScratchDir scratch("lora_targets");
  Tensor w = Tensor::from<float>(Shape{2, 2}, std::vector<float>{1, 2, 3, 4});
  Tensor A = Tensor::from<float>(Shape{1, 2}, std::vector<float>{1, 1});
  Tensor B = Tensor::from<float>(Shape{2, 1}, std::vector<float>{1, 1});
  fs::create_directories(scratch.path / "base");
  std::vector<StEntry> base = {entry_of("h.0.mlp.c_fc.weight", w)};
  write_safetensors(scratch.path / "base" / "model.safetensors", base, StMetadata{{"format", "pt"}});
  write_adapter(scratch.path / "a1", "h.0.mlp.c_fc", A, B, R"({"r": 1, "lora_alpha": 1, "target_modules": ["c_attn"]})");
  try {
    lora_merge(scratch.path / "base", scratch.path / "a1", scratch.path / "o1", {});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not in target_modules [c_attn]"), std::string::npos) << e.what();
  }
  write_adapter(scratch.path / "a2", "h.0.mlp.c_fc", A, B,
                R"({"r": 1, "lora_alpha": 1, "rank_pattern": {"c_fc": 4}})");
  EXPECT_THROW(lora_merge(scratch.path / "base", scratch.path / "a2", scratch.path / "o2", {}), Error);
  // use_rslora: scale lora_alpha / sqrt(r) = 4 / sqrt(4) = 2 with A, B of rank 4.
  Tensor A4 = Tensor::from<float>(Shape{4, 2}, std::vector<float>{1, 0, 0, 0, 0, 0, 0, 0});
  Tensor B4 = Tensor::from<float>(Shape{2, 4}, std::vector<float>{1, 0, 0, 0, 0, 0, 0, 0});
  write_adapter(scratch.path / "a3", "h.0.mlp.c_fc", A4, B4, R"({"r": 4, "lora_alpha": 4, "use_rslora": true})");
  ASSERT_EQ(lora_merge(scratch.path / "base", scratch.path / "a3", scratch.path / "o3", {}), 1u);
  Tensor got = GroupReader(scratch.path / "o3", "model").file_of("h.0.mlp.c_fc.weight").read("h.0.mlp.c_fc.weight");
  EXPECT_EQ(at(got, 0), 1 + 2);  // nn.Linear orientation: W[0][0] += 2 * B[0][0] A[0][0]
  EXPECT_EQ(at(got, 3), 4);
}

// PEFT matches a target_modules entry against the end of the module path at a dot: "attn.c_proj"
// adapts h.0.attn.c_proj and not h.0.mlp.c_proj. An adapter that does not fit its weight is refused
// naming both shapes, whatever the orientation.
TEST(CkptTools, LoraMergeMatchesDottedTargetsAsPeftAndNamesBothShapesOfAMisfit) {
  ScratchDir scratch("lora_suffix");
  Tensor w = Tensor::from<float>(Shape{2, 2}, std::vector<float>{1, 2, 3, 4});
  Tensor A = Tensor::from<float>(Shape{1, 2}, std::vector<float>{1, 1});
  Tensor B = Tensor::from<float>(Shape{2, 1}, std::vector<float>{1, 1});
  fs::create_directories(scratch.path / "base");
  std::vector<StEntry> base = {entry_of("h.0.attn.c_proj.weight", w), entry_of("h.0.mlp.c_proj.weight", w)};
  write_safetensors(scratch.path / "base" / "model.safetensors", base, StMetadata{{"format", "pt"}});
  const char* config = R"({"r": 1, "lora_alpha": 1, "fan_in_fan_out": true, "target_modules": ["attn.c_proj"]})";
  write_adapter(scratch.path / "attn", "h.0.attn.c_proj", A, B, config);
  EXPECT_EQ(lora_merge(scratch.path / "base", scratch.path / "attn", scratch.path / "o1", {}), 1u);
  write_adapter(scratch.path / "mlp", "h.0.mlp.c_proj", A, B, config);
  try {
    lora_merge(scratch.path / "base", scratch.path / "mlp", scratch.path / "o2", {});
    FAIL() << "mlp.c_proj merged under target_modules [attn.c_proj]";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("adapts module 'h.0.mlp.c_proj', which is not in target_modules [attn.c_proj]"),
              std::string::npos) << e.what();
  }
  Tensor A3 = Tensor::from<float>(Shape{1, 3}, std::vector<float>{1, 1, 1});
  write_adapter(scratch.path / "misfit", "h.0.attn.c_proj", A3, B, config);
  try {
    lora_merge(scratch.path / "base", scratch.path / "misfit", scratch.path / "o3", {});
    FAIL() << "a misfit adapter merged";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs lora_A [1, 2] and lora_B [2, 1] for rank 1, got [1, 3] and [2, 1]"),
              std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardwise::ckpt
