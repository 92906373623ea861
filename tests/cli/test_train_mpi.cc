// `shardwise train` under mpirun with 4 processes (dp=2 x tp=2; Llama on tp=2 x pp=2) follows the
// single-rank loss curve.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace {

std::vector<double> losses_of(const std::string& jsonl) {
  std::ifstream f(jsonl);
  std::vector<double> out;
  std::string line;
  while (std::getline(f, line)) out.push_back(std::stod(line.substr(line.find("\"loss\":") + 7)));
  return out;
}

TEST(TrainMpi, FourProcessesFollowTheSingleRankCurve) {
  const char* bin = std::getenv("SHARDWISE_BIN");
  ASSERT_NE(bin, nullptr);
  const std::string args = " --layers 2 --hidden 32 --steps 20 --global-batch 8 --lr 0.003 --warmup 3 --eval-every 0 ";
  std::system("rm -rf /tmp/shardwise-train-mpi-ref /tmp/shardwise-train-mpi-4");
  ASSERT_EQ(std::system((std::string(bin) + " train --mesh dp=1" + args + "--run-dir /tmp/shardwise-train-mpi-ref > /dev/null").c_str()), 0);
  std::string mpi = std::string(SHARDWISE_MPIRUN_LINE) + " -np 4 " + bin + " train --mesh dp=2,tp=2" + args +
                    "--run-dir /tmp/shardwise-train-mpi-4 > /tmp/shardwise-train-mpi-4.log 2>&1";
  ASSERT_EQ(std::system(mpi.c_str()), 0) << "see /tmp/shardwise-train-mpi-4.log";
  std::vector<double> ref = losses_of("/tmp/shardwise-train-mpi-ref/metrics.jsonl");
  std::vector<double> got = losses_of("/tmp/shardwise-train-mpi-4/metrics.jsonl");
  ASSERT_EQ(ref.size(), 20u);
  ASSERT_EQ(got.size(), 20u);
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(got[i], ref[i], 1e-5 * ref[i]) << "step " << i + 1;
  std::ifstream log("/tmp/shardwise-train-mpi-4.log");
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("(4 ranks, mpi)"), std::string::npos) << text;
}

// Llama with grouped-query attention and an untied head, its stages on 4 processes: tp=2 x pp=2.
TEST(TrainMpi, FourProcessesTrainLlamaOnTheSingleRankCurve) {
  const char* bin = std::getenv("SHARDWISE_BIN");
  ASSERT_NE(bin, nullptr);
  const std::string args =
      " --model llama --kv-heads 2 --untied-head --intermediate-size 64 --layers 2 --hidden 32 --steps 20"
      " --global-batch 8 --accumulation 2 --lr 0.003 --warmup 3 --eval-every 0 --digits 2 ";
  std::system("rm -rf /tmp/shardwise-llama-mpi-ref /tmp/shardwise-llama-mpi-4");
  ASSERT_EQ(std::system((std::string(bin) + " train --mesh dp=1" + args +
                         "--run-dir /tmp/shardwise-llama-mpi-ref > /dev/null").c_str()), 0);
  std::string mpi = std::string(SHARDWISE_MPIRUN_LINE) + " -np 4 " + bin + " train --mesh tp=2,pp=2" + args +
                    "--run-dir /tmp/shardwise-llama-mpi-4 > /tmp/shardwise-llama-mpi-4.log 2>&1";
  ASSERT_EQ(std::system(mpi.c_str()), 0) << "see /tmp/shardwise-llama-mpi-4.log";
  std::vector<double> ref = losses_of("/tmp/shardwise-llama-mpi-ref/metrics.jsonl");
  std::vector<double> got = losses_of("/tmp/shardwise-llama-mpi-4/metrics.jsonl");
  ASSERT_EQ(ref.size(), 20u);
  ASSERT_EQ(got.size(), 20u);
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(got[i], ref[i], 1e-5 * ref[i]) << "step " << i + 1;
  std::ifstream log("/tmp/shardwise-llama-mpi-4.log");
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("Llama (2 kv heads"), std::string::npos) << text;
  EXPECT_NE(text.find("(4 ranks, mpi)"), std::string::npos) << text;
}

}  // namespace
