// Hugging Face interop from the command line. `shardwise train --init-from` a transformers
// directory (tests/golden/hf, written by tools/hf_parity.py): threads and 4 MPI processes start from
// transformers' loss; the model configuration comes from the directory and a flag that contradicts
// it is refused. `ckpt inspect` shows which parameter each box of a fused tensor holds, and `ckpt
// merge` keeps that table.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "run_cli.h"

namespace {

namespace fs = std::filesystem;
using shardwise_cli_test::run;
using shardwise_cli_test::run_command;

const std::string kGolden = std::string(SHARDWISE_SOURCE_DIR) + "/tests/golden/hf";

double golden_loss() {
  std::ifstream f(kGolden + "/gpt2_tiny_expected.json");
  return nlohmann::json::parse(f)["loss"].get<double>();
}

double first_loss(const fs::path& run_dir) {
  std::ifstream f(run_dir / "metrics.jsonl");
  std::string line;
  std::getline(f, line);
  return nlohmann::json::parse(line)["loss"].get<double>();
}

// The tensors a model directory's model.safetensors holds, read from its JSON header.
int64_t stored_tensors(const std::string& dir) {
  std::ifstream f(dir + "/model.safetensors", std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  f.read(header.data(), static_cast<std::streamsize>(n));
  const nlohmann::json j = nlohmann::json::parse(header);
  return static_cast<int64_t>(j.size()) - (j.contains("__metadata__") ? 1 : 0);
}

std::string args(const fs::path& run_dir, const std::string& mesh) {
  return "train --init-from " + kGolden + "/gpt2_tiny --data " + kGolden + "/tokens.bin --mesh " + mesh +
         " --steps 1 --global-batch 4 --eval-every 0 --progress none --run-dir " + run_dir.string();
}

TEST(CliInitFrom, ThreadsAndMpiProcessesStartFromTransformersLoss) {
  const fs::path dir = fs::temp_directory_path() / "sw_cli_init_from";
  fs::remove_all(dir);
  auto r = run(args(dir / "threads", "tp=2"));
  ASSERT_EQ(r.status, 0) << r.out;
  // It counts tensors and says so: as many as the file's safetensors header names (the issue: "(36
  // parameters)" counted tensors).
  EXPECT_NE(r.out.find("weights from " + kGolden + "/gpt2_tiny (" + std::to_string(stored_tensors(kGolden + "/gpt2_tiny")) +
                       " tensors)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("GPT 2 layers, hidden 32, 4 heads, seq 16, vocab 300"), std::string::npos) << r.out;
  EXPECT_NEAR(first_loss(dir / "threads"), golden_loss(), 1e-5 * golden_loss());
  const char* bin = std::getenv("SHARDWISE_BIN");
  ASSERT_NE(bin, nullptr);
  auto m = run_command(std::string(SHARDWISE_MPIRUN_LINE) + " -np 4 " + bin + " " + args(dir / "mpi", "dp=2,tp=2"));
  ASSERT_EQ(m.status, 0) << m.out;
  EXPECT_NEAR(first_loss(dir / "mpi"), golden_loss(), 1e-5 * golden_loss());
  fs::remove_all(dir);
}

TEST(CliInitFrom, AFlagThatContradictsTheDirectoryIsRefused) {
  const fs::path dir = fs::temp_directory_path() / "sw_cli_init_from_bad";
  fs::remove_all(dir);
  auto r = run(args(dir, "tp=2") + " --hidden 64");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--hidden 64 contradicts --init-from"), std::string::npos) << r.out;
  r = run(args(dir, "tp=2") + " --hidden 32");  // agreeing is fine
  EXPECT_EQ(r.status, 0) << r.out;
  r = run("train --init-from /nonexistent/model --steps 1 --run-dir " + dir.string());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("'/nonexistent/model' is not a directory"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

TEST(CliHf, InspectShowsTheFusedBoxesAndMergeKeepsThem) {
  const fs::path dir = fs::temp_directory_path() / "sw_cli_hf_inspect";
  fs::remove_all(dir);
  auto r = run("train --mesh tp=2 --steps 2 --layers 1 --hidden 32 --heads 4 --digits 2 --global-batch 4 --save-every 2 "
               "--progress none --run-dir " + dir.string());
  ASSERT_EQ(r.status, 0) << r.out;
  const fs::path ckpt = dir / "checkpoints" / "checkpoint-2";
  for (const fs::path& d : {ckpt, dir / "merged"}) {
    if (d == dir / "merged") { ASSERT_EQ(run("ckpt merge " + ckpt.string() + " " + d.string()).status, 0); }
    r = run("ckpt inspect " + d.string());
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("transformer.h.0.attn.c_attn.weight  F32  [32, 96]"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("[0:32, 32:64] = transformer.h.0.attn.k_proj.weight"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("[64:96] = transformer.h.0.attn.v_proj.bias"), std::string::npos) << r.out;
  }
  fs::remove_all(dir);
}

}  // namespace

// generate bounds a Mistral's positions by its sliding window only where the window is the shorter
// (it took the window as the bound whatever its size: a window of 64 on a 16-position model let
// generation run past position 16), and the stop notice names the key that bounded it.
TEST(CliInitFrom, AMistralsPositionsAreBoundByTheShorterOfItsWindowAndMaxPositions) {
  const fs::path root = fs::temp_directory_path() / "sw_cli_mistral_window";
  fs::remove_all(root);
  for (int window : {64, 8}) {
    const fs::path dir = root / std::to_string(window);
    fs::create_directories(dir);
    for (const char* f : {"model.safetensors", "generation_config.json"})
      fs::copy_file(kGolden + "/mistral_tiny/" + f, dir / f);
    nlohmann::json config = nlohmann::json::parse(std::ifstream(kGolden + "/mistral_tiny/config.json"));
    ASSERT_EQ(config["max_position_embeddings"], 16);
    config["sliding_window"] = window;
    std::ofstream(dir / "config.json") << config.dump(2);
    auto r = run("generate --checkpoint " + dir.string() + " --prompt-ids 1,2,3,4,5,6 --max-new-tokens 20 --eos-id -1 --json");
    ASSERT_EQ(r.status, 0) << r.out;
    const size_t bound = window == 64 ? 16 : 8;
    const nlohmann::json j = nlohmann::json::parse(r.out.substr(r.out.find('{'), r.out.rfind('}') - r.out.find('{') + 1));
    // The prompt and the new tokens fill the bound's positions, and the last one predicts one more.
    EXPECT_EQ(6 + j["sequences"][0]["new_ids"].size(), bound + 1) << r.out;
    EXPECT_EQ(j["sequences"][0]["stop"], "max_positions") << r.out;
    EXPECT_NE(r.out.find(window == 64 ? "(max_position_embeddings;" : "(sliding_window;"), std::string::npos) << r.out;
  }
  fs::remove_all(root);
}
