// What a checkpoint of an `--init-from` run keeps of the model directory it started from: its
// special-token ids (config.json's and generation_config.json's, each its own, unless the run sets
// them), its dropout (trained, and saved as trained) and its tokenizer files; `generate` stops on every id of a
// generation_config.json's eos list. The fixtures are
// copies of tests/golden/hf's transformers directories with their token ids rewritten here.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "run_cli.h"

namespace {

namespace fs = std::filesystem;
using shardwise_cli_test::run;

const std::string kGolden = std::string(SHARDWISE_SOURCE_DIR) + "/tests/golden/hf";

struct TempDir : shardwise_cli_test::TempDir {
  explicit TempDir(const std::string& name) : shardwise_cli_test::TempDir("sw_cli_init_from_" + name) {
    fs::create_directories(path);
  }
};

nlohmann::json read_json(const fs::path& file) {
  std::ifstream f(file);
  return nlohmann::json::parse(f);
}

void write_json(const fs::path& file, const nlohmann::json& j) { std::ofstream(file) << j.dump(2); }

// A copy of golden model `name` at `dir` with `config` and `generation` merged into its config.json
// and generation_config.json.
fs::path model_copy(const std::string& name, const fs::path& dir, const nlohmann::json& config,
                    const nlohmann::json& generation) {
  fs::copy(kGolden + "/" + name, dir, fs::copy_options::recursive);
  nlohmann::json c = read_json(dir / "config.json"), g = read_json(dir / "generation_config.json");
  c.update(config);
  g.update(generation);
  write_json(dir / "config.json", c);
  write_json(dir / "generation_config.json", g);
  return dir;
}

// `train --init-from model` for 2 steps saving at step 2: the checkpoint's directory.
fs::path fine_tune(const fs::path& model, const std::string& tokens, const fs::path& run_dir, const std::string& extra = "") {
  auto r = run("train --init-from " + model.string() + " --data " + kGolden + "/" + tokens +
               " --steps 2 --global-batch 4 --eval-every 0 --progress none --save-every 2 --run-dir " +
               run_dir.string() + " " + extra);
  EXPECT_EQ(r.status, 0) << r.out;
  return run_dir / "checkpoints" / "checkpoint-2";
}

nlohmann::json token_fields(const fs::path& file) {
  nlohmann::json j = read_json(file), out = nlohmann::json::object();
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"})
    if (j.contains(key)) out[key] = j[key];
  return out;
}

TEST(CliInitFromKeeps, TheModelsSpecialTokenIdsUnlessTheRunSetsThem) {
  TempDir d("tokens");
  const nlohmann::json config = {{"bos_token_id", 1}, {"eos_token_id", 2}, {"pad_token_id", 0}},
                       generation = {{"bos_token_id", 1}, {"eos_token_id", {2, 3}}, {"pad_token_id", 0}};
  const fs::path llama = model_copy("llama_tiny", d.path / "llama", config, generation);
  fs::path ckpt = fine_tune(llama, "llama_tokens.bin", d.path / "run");
  EXPECT_EQ(token_fields(ckpt / "config.json"), config);
  EXPECT_EQ(token_fields(ckpt / "generation_config.json"), generation);
  // --eos-id sets eos (in both files); bos and pad stay the model's.
  ckpt = fine_tune(llama, "llama_tokens.bin", d.path / "eos", "--eos-id 4");
  EXPECT_EQ(token_fields(ckpt / "config.json"),
            (nlohmann::json{{"bos_token_id", 1}, {"eos_token_id", 4}, {"pad_token_id", 0}}));
  EXPECT_EQ(token_fields(ckpt / "generation_config.json"),
            (nlohmann::json{{"bos_token_id", 1}, {"eos_token_id", 4}, {"pad_token_id", 0}}));
  // A GPT-2 with eos 5, a null pad and a generation_config.json without pad: each kept as stored.
  const fs::path gpt2 = model_copy("gpt2_tiny", d.path / "gpt2",
                                   {{"bos_token_id", 4}, {"eos_token_id", 5}, {"pad_token_id", nullptr}},
                                   {{"bos_token_id", 4}, {"eos_token_id", 5}});
  ckpt = fine_tune(gpt2, "tokens.bin", d.path / "gpt2-run");
  EXPECT_EQ(token_fields(ckpt / "config.json"),
            (nlohmann::json{{"bos_token_id", 4}, {"eos_token_id", 5}, {"pad_token_id", nullptr}}));
  EXPECT_EQ(token_fields(ckpt / "generation_config.json"), (nlohmann::json{{"bos_token_id", 4}, {"eos_token_id", 5}}));
}

double first_loss(const fs::path& run_dir) {
  std::ifstream f(run_dir / "metrics.jsonl");
  std::string line;
  std::getline(f, line);
  return nlohmann::json::parse(line)["loss"].get<double>();
}

// GPT-2's resid/embd/attn_pdrop (one probability at GPT-2's three sites, as shardwise's --dropout)
// are trained with and saved; --dropout overrides them; three different ones are refused naming
// them and --dropout. Llama's attention_dropout likewise.
TEST(CliInitFromKeeps, TheModelsDropout) {
  TempDir d("dropout");
  const nlohmann::json p1 = {{"resid_pdrop", 0.1}, {"embd_pdrop", 0.1}, {"attn_pdrop", 0.1}};
  const fs::path gpt2 = model_copy("gpt2_tiny", d.path / "gpt2", p1, nlohmann::json::object());
  fs::path ckpt = fine_tune(gpt2, "tokens.bin", d.path / "kept");
  for (const char* key : {"resid_pdrop", "embd_pdrop", "attn_pdrop"})
    EXPECT_EQ(read_json(ckpt / "config.json")[key], 0.1) << key;
  fine_tune(gpt2, "tokens.bin", d.path / "explicit", "--dropout 0.1");
  ckpt = fine_tune(gpt2, "tokens.bin", d.path / "none", "--dropout 0");
  EXPECT_EQ(read_json(ckpt / "config.json")["resid_pdrop"], 0.0);
  EXPECT_EQ(first_loss(d.path / "kept"), first_loss(d.path / "explicit"));  // trained with 0.1
  EXPECT_NE(first_loss(d.path / "kept"), first_loss(d.path / "none"));
  const fs::path mixed = model_copy("gpt2_tiny", d.path / "mixed", {{"resid_pdrop", 0.1}, {"embd_pdrop", 0.0}},
                                    nlohmann::json::object());
  auto r = run("train --init-from " + mixed.string() + " --data " + kGolden + "/tokens.bin --steps 1 --global-batch 4 "
               "--progress none --run-dir " + (d.path / "mixed-run").string());
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("resid_pdrop 0.1, embd_pdrop 0 and attn_pdrop 0 differ"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("choose it with --dropout P"), std::string::npos) << r.out;
  ckpt = fine_tune(mixed, "tokens.bin", d.path / "mixed-chosen", "--dropout 0.05");
  EXPECT_EQ(read_json(ckpt / "config.json")["attn_pdrop"], 0.05);
  const fs::path llama = model_copy("llama_tiny", d.path / "llama", {{"attention_dropout", 0.2}}, nlohmann::json::object());
  ckpt = fine_tune(llama, "llama_tokens.bin", d.path / "llama-run");
  EXPECT_EQ(read_json(ckpt / "config.json")["attention_dropout"], 0.2);
}

std::string bytes_of(const fs::path& file) {
  std::ifstream f(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The directory's tokenizer files are copied byte for byte into every checkpoint, listed in its
// manifest (ckpt verify checks their digests), and on by `ckpt merge`; a checkpoint of a model
// without them has none.
TEST(CliInitFromKeeps, TheModelsTokenizerFiles) {
  TempDir d("tokenizer");
  const fs::path gpt2 = model_copy("gpt2_tiny", d.path / "gpt2", nlohmann::json::object(), nlohmann::json::object());
  const std::map<std::string, std::string> files = {
      {"tokenizer.json", R"({"version": "1.0", "model": {"type": "BPE"}})"},
      {"tokenizer_config.json", R"({"tokenizer_class": "GPT2Tokenizer", "model_max_length": 16})"},
      {"special_tokens_map.json", R"({"eos_token": "<|endoftext|>"})"},
      {"vocab.json", R"({"a": 0, "b": 1})"},
      {"merges.txt", std::string("#version: 0.2\na b\n\0\xff", 20)}};
  for (const auto& [name, text] : files) std::ofstream(gpt2 / name, std::ios::binary) << text;
  const fs::path ckpt = fine_tune(gpt2, "tokens.bin", d.path / "run");
  const nlohmann::json manifest = read_json(ckpt / "manifest.json");
  for (const auto& [name, text] : files) {
    EXPECT_EQ(bytes_of(ckpt / name), text) << name;
    EXPECT_NE(manifest.dump().find("\"" + name + "\""), std::string::npos) << name << " not in the manifest";
  }
  auto r = run("ckpt verify " + ckpt.string());
  EXPECT_EQ(r.status, 0) << r.out;
  r = run("ckpt merge " + ckpt.string() + " " + (d.path / "merged").string());  // the tools carry them too
  ASSERT_EQ(r.status, 0) << r.out;
  for (const auto& [name, text] : files) EXPECT_EQ(bytes_of(d.path / "merged" / name), text) << name;
  const fs::path bare = fine_tune(kGolden + "/gpt2_tiny", "tokens.bin", d.path / "bare");
  for (const auto& [name, text] : files) EXPECT_FALSE(fs::exists(bare / name)) << name;
}

// generate --json's new ids for `prompt` on `model` (greedy, 8 new tokens).
nlohmann::json generated(const fs::path& model, const std::string& extra = "") {
  auto r = run("generate --checkpoint " + model.string() + " --prompt-ids 5,6,7 --max-new-tokens 8 --json " + extra);
  EXPECT_EQ(r.status, 0) << r.out;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind('{', 0) == 0) return nlohmann::json::parse(line)["sequences"][0];
  ADD_FAILURE() << r.out;
  return {};
}

TEST(CliInitFromKeeps, GenerateStopsOnEveryIdOfAnEosList) {
  TempDir d("eos_list");
  const fs::path llama = model_copy("llama_tiny", d.path / "llama", nlohmann::json::object(), nlohmann::json::object());
  const std::vector<int64_t> all = generated(llama, "--eos-id -1")["new_ids"].get<std::vector<int64_t>>();
  ASSERT_EQ(all.size(), 8u);
  // The first new token that did not come before it, and an id that none before it is.
  size_t k = 1;
  while (k < all.size() && std::count(all.begin(), all.begin() + static_cast<int64_t>(k), all[k]) > 0) ++k;
  ASSERT_LT(k, all.size()) << "the greedy continuation repeats one token";
  int64_t other = 0;
  while (std::count(all.begin(), all.begin() + static_cast<int64_t>(k) + 1, other) > 0) ++other;
  write_json(llama / "generation_config.json", {{"bos_token_id", 1}, {"eos_token_id", {other, all[k]}}});
  const nlohmann::json s = generated(llama);
  EXPECT_EQ(s["new_ids"].get<std::vector<int64_t>>(),
            std::vector<int64_t>(all.begin(), all.begin() + static_cast<int64_t>(k) + 1));
  EXPECT_EQ(s["stop"], "eos");
}

}  // namespace
