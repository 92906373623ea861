// `shardwise train` under mpirun with 4 processes (dp=2 x tp=2; Llama on tp=2 x pp=2) follows the
// single-rank loss curve; on a token file unreadable for the processes that are not their tp group's
// reader (the test hook SHARDWISE_TEST_UNREADABLE_FOR_RANKS: opening or reading the data there is an
// error) it still trains the same curve, validates and saves checkpoints; with --recompute full it
// trains bit for bit the losses without.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace {

// The values of `key` ("loss", "val_loss") in the lines of metrics.jsonl that have one.
std::vector<double> losses_of(const std::string& jsonl, const std::string& key = "loss") {
  std::ifstream f(jsonl);
  std::vector<double> out;
  std::string line;
  const std::string field = "\"" + key + "\":";
  while (std::getline(f, line)) {
    if (const size_t at = line.find(field); at != std::string::npos) out.push_back(std::stod(line.substr(at + field.size())));
  }
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

// Trains `args` on one rank and on 4 processes on `mesh`: the same 20 losses within 1e-5. Returns
// the 4-process log.
std::string expect_four_processes_follow_one_rank(const std::string& args, const std::string& mesh,
                                                  const std::string& name) {
  const char* bin = std::getenv("SHARDWISE_BIN");
  EXPECT_NE(bin, nullptr);
  if (!bin) return {};
  const std::string ref_dir = "/tmp/shardwise-" + name + "-mpi-ref", dir = "/tmp/shardwise-" + name + "-mpi-4";
  std::system(("rm -rf " + ref_dir + " " + dir).c_str());
  EXPECT_EQ(std::system((std::string(bin) + " train --mesh dp=1" + args + "--run-dir " + ref_dir + " > /dev/null").c_str()), 0);
  std::string mpi = std::string(SHARDWISE_MPIRUN_LINE) + " -np 4 " + bin + " train --mesh " + mesh + args +
                    "--run-dir " + dir + " > " + dir + ".log 2>&1";
  EXPECT_EQ(std::system(mpi.c_str()), 0) << "see " << dir << ".log";
  std::vector<double> ref = losses_of(ref_dir + "/metrics.jsonl");
  std::vector<double> got = losses_of(dir + "/metrics.jsonl");
  EXPECT_EQ(ref.size(), 20u);
  EXPECT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
    EXPECT_NEAR(got[i], ref[i], 1e-5 * ref[i]) << name << ", step " << i + 1;
  }
  std::ifstream log(dir + ".log");
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("(4 ranks, mpi)"), std::string::npos) << text;
  return text;
}

// Llama with grouped-query attention and an untied head, its stages on 4 processes: tp=2 x pp=2.
TEST(TrainMpi, FourProcessesTrainLlamaOnTheSingleRankCurve) {
  const std::string args =
      " --model llama --kv-heads 2 --untied-head --intermediate-size 64 --layers 2 --hidden 32 --steps 20"
      " --global-batch 8 --accumulation 2 --lr 0.003 --warmup 3 --eval-every 0 --digits 2 ";
  const std::string text = expect_four_processes_follow_one_rank(args, "tp=2,pp=2", "llama");
  EXPECT_NE(text.find("Llama (2 kv heads"), std::string::npos) << text;
}

// An MoE Llama (4 experts, top-2, aux and z losses) with its experts split over ep=2 and the batch
// over dp=2 on 4 processes: MPI's all_to_all_v carries the tokens.
TEST(TrainMpi, FourProcessesTrainAnMoeLlamaOnTheSingleRankCurve) {
  const std::string args =
      " --model llama --kv-heads 2 --layers 2 --hidden 32 --seq 10 --vocab 128 --experts 4 --top-k 2 --aux-loss 0.01"
      " --router-z-loss 0.001 --steps 20 --global-batch 8 --accumulation 2 --lr 0.003 --warmup 3 --eval-every 0"
      " --digits 2 ";
  expect_four_processes_follow_one_rank(args, "dp=2,ep=2", "moe");
}

// Sharding stage 2 (v2, dp=2 x tp=2), stage 1 (v1, dp=4) and stage 3 (dp=2 x tp=2 with full recompute,
// pp=2 x dp=2) on 4 processes follow plain dp on threads (the same mesh).
TEST(TrainMpi, ShardedOptimizerOnFourProcessesFollowsPlainDataParallel) {
  const char* bin = std::getenv("SHARDWISE_BIN");
  ASSERT_NE(bin, nullptr);
  const std::string args = " --layers 2 --hidden 32 --steps 20 --global-batch 8 --accumulation 2 --lr 0.003 --warmup 3"
                           " --eval-every 0 ";
  for (const auto& [mesh, sharding] : {std::pair<std::string, std::string>{"dp=2,tp=2", "--sharding-stage 2 --sharding-layout v2"},
                                       std::pair<std::string, std::string>{"dp=4", "--sharding-stage 1 --sharding-layout v1"},
                                       std::pair<std::string, std::string>{"dp=2,tp=2", "--sharding-stage 3 --recompute full"},
                                       std::pair<std::string, std::string>{"pp=2,dp=2", "--sharding-stage 3"}}) {
    std::system("rm -rf /tmp/shardwise-shard-mpi-ref /tmp/shardwise-shard-mpi-4");
    ASSERT_EQ(std::system((std::string(bin) + " train --mesh " + mesh + args +
                           "--run-dir /tmp/shardwise-shard-mpi-ref > /dev/null").c_str()), 0);
    std::vector<double> ref = losses_of("/tmp/shardwise-shard-mpi-ref/metrics.jsonl");
    ASSERT_EQ(ref.size(), 20u);
    std::string mpi = std::string(SHARDWISE_MPIRUN_LINE) + " -np 4 " + bin + " train --mesh " + mesh + args + sharding +
                      " --run-dir /tmp/shardwise-shard-mpi-4 > /tmp/shardwise-shard-mpi-4.log 2>&1";
    ASSERT_EQ(std::system(mpi.c_str()), 0) << "see /tmp/shardwise-shard-mpi-4.log";
    std::vector<double> got = losses_of("/tmp/shardwise-shard-mpi-4/metrics.jsonl");
    ASSERT_EQ(got.size(), 20u);
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(got[i], ref[i], 1e-5 * ref[i]) << mesh << " " << sharding << " step " << i + 1;
  }
}

// Gradient buckets on 4 processes (MPI_Iallreduce / MPI_Ireduce_scatter): overlap on equals the
// same buckets reduced after the backward bit for bit, and plain dp on threads within 1e-5; stage
// 0 on dp=4 and stage 2 v2 on dp=2 x tp=2 with 2 micro-batches, stage 2 v1 on dp=4 with one (each
// gradient freed once handed over), small buckets (several per step).
TEST(TrainMpi, OverlappedGradientReductionOnFourProcesses) {
  const char* bin = std::getenv("SHARDWISE_BIN");
  ASSERT_NE(bin, nullptr);
  for (const auto& [mesh, sharding, accumulation] :
       {std::tuple<std::string, std::string, int>{"dp=4", "--sharding-stage 0", 2},
        std::tuple<std::string, std::string, int>{"dp=2,tp=2", "--sharding-stage 2 --sharding-layout v2", 2},
        std::tuple<std::string, std::string, int>{"dp=4", "--sharding-stage 2 --sharding-layout v1", 1}}) {
    const std::string args = " --layers 2 --hidden 32 --steps 10 --global-batch 8 --lr 0.003 --warmup 3 --eval-every 0"
                             " --grad-bucket-mb 0.01 --accumulation " + std::to_string(accumulation) + " ";
    std::system("rm -rf /tmp/shardwise-overlap-mpi-ref /tmp/shardwise-overlap-mpi-on /tmp/shardwise-overlap-mpi-after");
    ASSERT_EQ(std::system((std::string(bin) + " train --mesh " + mesh + args +
                           "--run-dir /tmp/shardwise-overlap-mpi-ref > /dev/null").c_str()), 0);
    std::vector<double> ref = losses_of("/tmp/shardwise-overlap-mpi-ref/metrics.jsonl");
    ASSERT_EQ(ref.size(), 10u);
    std::vector<double> runs[2];
    for (int k = 0; k < 2; ++k) {
      const std::string mode = k == 0 ? "on" : "after";
      std::string mpi = std::string(SHARDWISE_MPIRUN_LINE) + " -np 4 " + bin + " train --mesh " + mesh + args + sharding +
                        " --overlap-grad-reduce " + mode + " --run-dir /tmp/shardwise-overlap-mpi-" + mode +
                        " > /tmp/shardwise-overlap-mpi.log 2>&1";
      ASSERT_EQ(std::system(mpi.c_str()), 0) << "see /tmp/shardwise-overlap-mpi.log";
      runs[k] = losses_of("/tmp/shardwise-overlap-mpi-" + mode + "/metrics.jsonl");
      ASSERT_EQ(runs[k].size(), 10u);
    }
    EXPECT_EQ(runs[0], runs[1]) << mesh << " " << sharding;
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(runs[0][i], ref[i], 1e-5 * ref[i]) << mesh << " " << sharding << " step " << i + 1;
    std::ifstream log("/tmp/shardwise-overlap-mpi.log");
    std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("gradients: reduced over dp in buckets of 0.01 MiB"), std::string::npos) << text;
  }
}

// A u16 token file of `n` tokens below 128.
std::string token_file(const std::string& path, int n) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (int i = 0; i < n; ++i) {
    const int t = (i * 37 + i / 7) % 128;
    out.put(static_cast<char>(t)).put('\0');
  }
  return path;
}

// Processes 1 and 3 (tp coordinate 1 on dp=2 x tp=2) may neither open nor read the data: only the
// readers do, for training, validation (--val-fraction) and the checkpoints' data fingerprint. As
// threads (the hook per rank thread) and as 4 MPI processes the curves are those without the hook.
TEST(TrainMpi, ProcessesThatAreNotReadersNeverReadTheData) {
  const char* bin = std::getenv("SHARDWISE_BIN");
  ASSERT_NE(bin, nullptr);
  const std::string data = token_file("/tmp/shardwise-loader-mpi.bin", 4000);
  const std::string args = " --layers 2 --hidden 32 --seq 16 --steps 6 --global-batch 8 --lr 0.003 --warmup 3"
                           " --eval-every 2 --val-fraction 0.2 --val-samples 5 --save-every 3 --data " + data +
                           " --mesh dp=2,tp=2 ";
  std::system("rm -rf /tmp/shardwise-loader-threads /tmp/shardwise-loader-hooked /tmp/shardwise-loader-mpi "
              "/tmp/shardwise-loader-mpi-bad");
  ASSERT_EQ(std::system((std::string(bin) + " train" + args + "--run-dir /tmp/shardwise-loader-threads > /dev/null").c_str()), 0);
  const std::string hooked = "SHARDWISE_TEST_UNREADABLE_FOR_RANKS=1,3 " + std::string(bin) + " train" + args +
                             "--run-dir /tmp/shardwise-loader-hooked > /tmp/shardwise-loader-hooked.log 2>&1";
  ASSERT_EQ(std::system(hooked.c_str()), 0) << "see /tmp/shardwise-loader-hooked.log";
  const std::string mpi = "SHARDWISE_TEST_UNREADABLE_FOR_RANKS=1,3 " + std::string(SHARDWISE_MPIRUN_LINE) + " -np 4 " +
                          bin + " train" + args;
  ASSERT_EQ(std::system((mpi + "--run-dir /tmp/shardwise-loader-mpi > /tmp/shardwise-loader-mpi.log 2>&1").c_str()), 0)
      << "see /tmp/shardwise-loader-mpi.log";
  for (const std::string key : {"loss", "val_loss"}) {
    std::vector<double> ref = losses_of("/tmp/shardwise-loader-threads/metrics.jsonl", key);
    ASSERT_EQ(ref.size(), key == "loss" ? 6u : 3u) << key;
    for (const std::string run : {"/tmp/shardwise-loader-hooked", "/tmp/shardwise-loader-mpi"}) {
      std::vector<double> got = losses_of(run + "/metrics.jsonl", key);
      ASSERT_EQ(got.size(), ref.size()) << run << " " << key;
      for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(got[i], ref[i], 1e-6 * ref[i]) << run << " " << key << " " << i;
    }
  }
  EXPECT_EQ(std::system("test -d /tmp/shardwise-loader-mpi/checkpoints/checkpoint-6"), 0);
  // The hook bites: a reader listed (process 2) fails as it opens the file; every process stops naming it.
  const std::string bad = "SHARDWISE_TEST_UNREADABLE_FOR_RANKS=2 " + std::string(SHARDWISE_MPIRUN_LINE) + " -np 4 " +
                          bin + " train" + args + "--run-dir /tmp/shardwise-loader-mpi-bad > /tmp/shardwise-loader-bad.log 2>&1";
  EXPECT_NE(std::system(bad.c_str()), 0);
  std::ifstream log("/tmp/shardwise-loader-bad.log");
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("SHARDWISE_TEST_UNREADABLE_FOR_RANKS=2"), std::string::npos) << text;
}

}  // namespace

// Activation recompute under mpirun: 4 processes (tp=2 x pp=2, 1F1B over 2 micro-batches, dropout
// 0.1) train bit for bit the losses of the same run without full recompute (selective and the
// other meshes and schedules: tests/train/test_recompute.cc, with threads).
TEST(TrainMpi, RecomputeKeepsTheLossesBitForBit) {
  const char* bin = std::getenv("SHARDWISE_BIN");
  ASSERT_NE(bin, nullptr);
  const std::string args = " --mesh tp=2,pp=2 --layers 4 --hidden 32 --steps 3 --global-batch 8 --accumulation 2"
                           " --dropout 0.1 --lr 0.003 --warmup 3 --eval-every 0 --digits 2 ";
  std::vector<std::vector<double>> curves;
  for (const char* mode : {"none", "full"}) {
    const std::string dir = std::string("/tmp/shardwise-recompute-mpi-") + mode;
    std::system(("rm -rf " + dir).c_str());
    std::string cmd = std::string(SHARDWISE_MPIRUN_LINE) + " -np 4 " + bin + " train" + args + "--recompute " + mode +
                      " --run-dir " + dir + " > " + dir + ".log 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << "see " << dir << ".log";
    curves.push_back(losses_of(dir + "/metrics.jsonl"));
    ASSERT_EQ(curves.back().size(), 3u) << mode;
  }
  EXPECT_EQ(curves[1], curves[0]);
}
