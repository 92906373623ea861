// `shardwise train --init-from` a transformers directory (tests/golden/hf, written by
// tools/hf_parity.py): threads and 4 MPI processes start from transformers' loss; the model
// configuration comes from the directory and a flag that contradicts it is refused.
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

std::string args(const fs::path& run_dir, const std::string& mesh) {
  return "train --init-from " + kGolden + "/gpt2_tiny --data " + kGolden + "/tokens.bin --mesh " + mesh +
         " --steps 1 --global-batch 4 --eval-every 0 --progress none --run-dir " + run_dir.string();
}

TEST(CliInitFrom, ThreadsAndMpiProcessesStartFromTransformersLoss) {
  const fs::path dir = fs::temp_directory_path() / "sw_cli_init_from";
  fs::remove_all(dir);
  auto r = run(args(dir / "threads", "tp=2"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("weights from"), std::string::npos) << r.out;
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

}  // namespace
