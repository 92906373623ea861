// `shardwise train` under mpirun with 4 processes (dp=2 x tp=2; Llama on tp=2 x pp=2; cp meshes) follows the
// single-rank loss curve; on a token file unreadable for the processes that are not their tp group's
// reader (the test hook SHARDWISE_TEST_UNREADABLE_FOR_RANKS: opening or reading the data there is an
// error) it still trains the same curve, validates and saves checkpoints; with --recompute full it
// trains bit for bit the losses without.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "run_cli.h"
#include "shardwise/ckpt/checksum.h"

using shardwise_cli_test::tmp;

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
  std::system(("rm -rf " + tmp("shardwise-train-mpi-ref") + " " + tmp("shardwise-train-mpi-4")).c_str());
  ASSERT_EQ(std::system((std::string(bin) + " train --mesh dp=1" + args + "--run-dir " + tmp("shardwise-train-mpi-ref") + " > /dev/null").c_str()), 0);
  std::string mpi = std::string(SHARDWISE_MPIRUN_LINE) + " -np 4 " + bin + " train --mesh dp=2,tp=2" + args +
                    "--run-dir " + tmp("shardwise-train-mpi-4") + " > " + tmp("shardwise-train-mpi-4.log") + " 2>&1";
  ASSERT_EQ(std::system(mpi.c_str()), 0) << "see " + tmp("shardwise-train-mpi-4.log");
  std::vector<double> ref = losses_of(tmp("shardwise-train-mpi-ref/metrics.jsonl"));
  std::vector<double> got = losses_of(tmp("shardwise-train-mpi-4/metrics.jsonl"));
  ASSERT_EQ(ref.size(), 20u);
  ASSERT_EQ(got.size(), 20u);
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(got[i], ref[i], 1e-5 * ref[i]) << "step " << i + 1;
  std::ifstream log(tmp("shardwise-train-mpi-4.log"));
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
  const std::string ref_dir = tmp("shardwise-") + name + "-mpi-ref", dir = tmp("shardwise-") + name + "-mpi-4";
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

// Context parallelism under MPI: Llama on dp=2 x cp=2 (ring attention: k, v blocks sent between
// processes by MPI point-to-point), and GPT-2 on tp=2 x cp=2 with the all-gather variant.
TEST(TrainMpi, FourProcessesTrainOnCpMeshesOnTheSingleRankCurve) {
  const std::string llama = " --model llama --kv-heads 2 --untied-head --intermediate-size 64 --layers 2 --hidden 32 "
                            "--seq 16 --steps 20 --global-batch 8 --accumulation 2 --lr 0.003 --warmup 3 --eval-every 0 "
                            "--digits 2 ";
  expect_four_processes_follow_one_rank(llama, "dp=2,cp=2", "cp-llama");
  const std::string gpt = " --layers 2 --hidden 32 --seq 16 --steps 20 --global-batch 8 --lr 0.003 --warmup 3 "
                          "--eval-every 0 --cp-attention gather ";
  expect_four_processes_follow_one_rank(gpt, "tp=2,cp=2", "cp-gpt");
}

// The MoE Llama (4 experts, top-2, aux and z losses) of the 20-step curves below.
const std::string kMoeLlama20 =
    " --model llama --kv-heads 2 --layers 2 --hidden 32 --seq 10 --vocab 128 --experts 4 --top-k 2 --aux-loss 0.01"
    " --router-z-loss 0.001 --steps 20 --global-batch 8 --accumulation 2 --lr 0.003 --warmup 3 --eval-every 0"
    " --digits 2 ";

// An MoE Llama (4 experts, top-2, aux and z losses) with its experts split over ep=2 and the batch
// over dp=2 on 4 processes: the tokens travel through the node-shared window (the default on one
// node), and by MPI messages (SHARDWISE_MOE_EXCHANGE=messages), to the same bits.
TEST(TrainMpi, FourProcessesTrainAnMoeLlamaOnTheSingleRankCurve) {
  const std::string args = kMoeLlama20;
  expect_four_processes_follow_one_rank(args, "dp=2,ep=2", "moe");
  ::setenv("SHARDWISE_MOE_EXCHANGE", "messages", 1);
  expect_four_processes_follow_one_rank(args, "dp=2,ep=2", "moe-messages");
  ::unsetenv("SHARDWISE_MOE_EXCHANGE");
  const std::vector<double> shared = losses_of(tmp("shardwise-moe-mpi-4/metrics.jsonl"));
  EXPECT_EQ(shared, losses_of(tmp("shardwise-moe-messages-mpi-4/metrics.jsonl")));
  EXPECT_EQ(shared.size(), 20u);
}

// The MoE Llama on cp=2 x ep=2 (--seq 16 for cp's 2 x 2 chunks): each process routes its own
// tokens of its sequences' blocks, the all-to-alls over ep, the router's means over all four.
TEST(TrainMpi, FourProcessesTrainAnMoeLlamaOnCpTimesEp) {
  std::string args = kMoeLlama20;
  args.replace(args.find("--seq 10"), 8, "--seq 16");
  expect_four_processes_follow_one_rank(args, "cp=2,ep=2", "moe-cp");
}

// The same with each parameter's state sharded over its data group under MPI (dense ones over
// dp x ep, the experts' over dp): stage 2 with overlapped buckets (an open bucket per group, the
// reduce-scatters on two communicators) and stage 3 (dense parameters stored in quarters).
TEST(TrainMpi, FourProcessesTrainAnMoeLlamaWithStateShardedOverDpTimesEp) {
  expect_four_processes_follow_one_rank(kMoeLlama20 + "--sharding-stage 2 --sharding-layout v2 --overlap-grad-reduce on ",
                                        "dp=2,ep=2", "moe-stage2");
  expect_four_processes_follow_one_rank(kMoeLlama20 + "--sharding-stage 3 ", "ep=2,dp=2", "moe-stage3");
}

// The MoE Llama's checkpoint in Mixtral's layout saved by 4 processes on ep=2 x dp=2 (each ep rank
// writing its own experts' keys), resumed on one rank: steps 5..8 continue the single-rank curve.
TEST(TrainMpi, AnMoeCheckpointSavedOnFourProcessesResumesOnOneRank) {
  const char* bin = std::getenv("SHARDWISE_BIN");
  ASSERT_NE(bin, nullptr);
  const std::string args =
      " --model llama --kv-heads 2 --layers 2 --hidden 32 --seq 10 --vocab 128 --experts 4 --top-k 2 --aux-loss 0.01"
      " --steps 8 --global-batch 8 --lr 0.003 --warmup 3 --eval-every 0 --digits 2 --progress none ";
  const std::string ref_dir = tmp("shardwise-moe-ckpt-ref"), dir = tmp("shardwise-moe-ckpt-mpi"),
                    back = tmp("shardwise-moe-ckpt-back");
  std::system(("rm -rf " + ref_dir + " " + dir + " " + back).c_str());
  ASSERT_EQ(std::system((std::string(bin) + " train --mesh dp=1" + args + "--run-dir " + ref_dir + " > /dev/null").c_str()), 0);
  const std::string mpi = std::string(SHARDWISE_MPIRUN_LINE) + " -np 4 " + bin + " train --mesh dp=2,ep=2" + args +
                          "--save-every 4 --run-dir " + dir + " > " + dir + ".log 2>&1";
  ASSERT_EQ(std::system(mpi.c_str()), 0) << "see " << dir << ".log";
  std::ifstream index(dir + "/checkpoints/checkpoint-4/model.safetensors.index.json");
  const std::string text((std::istreambuf_iterator<char>(index)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("model.layers.1.block_sparse_moe.experts.3.w2.weight"), std::string::npos) << text;
  ASSERT_EQ(std::system((std::string(bin) + " train --mesh dp=1" + args + "--resume " + dir +
                         "/checkpoints/checkpoint-4 --run-dir " + back + " > " + back + ".log 2>&1").c_str()), 0)
      << "see " << back << ".log";
  const std::vector<double> ref = losses_of(ref_dir + "/metrics.jsonl"), rest = losses_of(back + "/metrics.jsonl");
  ASSERT_EQ(ref.size(), 8u);
  ASSERT_EQ(rest.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(rest[i], ref[i + 4], 1e-5 * ref[i + 4]) << "step " << i + 5;
}

// The same MoE Llama on pp=2 x ep=2 processes: the first stage's router losses reach the loss, and
// the MoE metrics (the first layer's tokens per expert, from the first stage's processes) are the
// single-rank run's.
TEST(TrainMpi, FourProcessesTrainAnMoeLlamaOnPipelineStages) {
  const std::string args = kMoeLlama20;
  expect_four_processes_follow_one_rank(args, "pp=2,ep=2", "moe-pp");
  for (const char* key : {"tokens_per_expert_min", "tokens_per_expert_max"}) {
    std::vector<double> ref = losses_of(tmp("shardwise-moe-pp-mpi-ref/metrics.jsonl"), key);
    EXPECT_EQ(ref.size(), 20u) << key;
    EXPECT_EQ(losses_of(tmp("shardwise-moe-pp-mpi-4/metrics.jsonl"), key), ref) << key;
  }
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
    std::system(("rm -rf " + tmp("shardwise-shard-mpi-ref") + " " + tmp("shardwise-shard-mpi-4")).c_str());
    ASSERT_EQ(std::system((std::string(bin) + " train --mesh " + mesh + args +
                           "--run-dir " + tmp("shardwise-shard-mpi-ref") + " > /dev/null").c_str()), 0);
    std::vector<double> ref = losses_of(tmp("shardwise-shard-mpi-ref/metrics.jsonl"));
    ASSERT_EQ(ref.size(), 20u);
    std::string mpi = std::string(SHARDWISE_MPIRUN_LINE) + " -np 4 " + bin + " train --mesh " + mesh + args + sharding +
                      " --run-dir " + tmp("shardwise-shard-mpi-4") + " > " + tmp("shardwise-shard-mpi-4.log") + " 2>&1";
    ASSERT_EQ(std::system(mpi.c_str()), 0) << "see " + tmp("shardwise-shard-mpi-4.log");
    std::vector<double> got = losses_of(tmp("shardwise-shard-mpi-4/metrics.jsonl"));
    ASSERT_EQ(got.size(), 20u);
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(got[i], ref[i], 1e-5 * ref[i]) << mesh << " " << sharding << " step " << i + 1;
  }
}

// Stage 3 with --prefetch-params 1 on 4 processes (MPI_Iallgatherv started a layer ahead): the
// losses of stage 3 without prefetch on 4 processes bit for bit, and plain dp on threads within 1e-5.
TEST(TrainMpi, StageThreePrefetchOnFourProcessesGivesTheBitsOfNoPrefetch) {
  const char* bin = std::getenv("SHARDWISE_BIN");
  ASSERT_NE(bin, nullptr);
  const std::string args = " --layers 2 --hidden 32 --steps 10 --global-batch 8 --accumulation 2 --lr 0.003 --warmup 3"
                           " --eval-every 0 ";
  const std::string root = tmp("shardwise-prefetch-mpi");
  for (const auto& [mesh, extra] : {std::pair<std::string, std::string>{"dp=4", ""},
                                    std::pair<std::string, std::string>{"dp=2,tp=2", "--recompute full"},
                                    std::pair<std::string, std::string>{"pp=2,dp=2", ""}}) {
    std::system(("rm -rf " + root + "-ref " + root + "-off " + root + "-on").c_str());
    ASSERT_EQ(std::system((std::string(bin) + " train --mesh " + mesh + args + "--run-dir " + root + "-ref > /dev/null").c_str()), 0);
    auto mpirun = [&](const std::string& name, const std::string& prefetch) {
      std::string line = std::string(SHARDWISE_MPIRUN_LINE) + " -np 4 " + bin + " train --mesh " + mesh + args +
                         "--sharding-stage 3 " + extra + " --prefetch-params " + prefetch + " --run-dir " + root + "-" +
                         name + " > " + root + "-" + name + ".log 2>&1";
      return std::system(line.c_str());
    };
    ASSERT_EQ(mpirun("off", "0"), 0) << "see " << root << "-off.log";
    ASSERT_EQ(mpirun("on", "1"), 0) << "see " << root << "-on.log";
    const std::vector<double> ref = losses_of(root + "-ref/metrics.jsonl"), off = losses_of(root + "-off/metrics.jsonl"),
                              on = losses_of(root + "-on/metrics.jsonl");
    ASSERT_EQ(on.size(), 10u) << mesh;
    EXPECT_EQ(on, off) << mesh << " " << extra << ": prefetch changed the bits";
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(on[i], ref[i], 1e-5 * ref[i]) << mesh << " step " << i + 1;
  }
}

// The xxh64 of each safetensors and index file its manifest lists, read from the files (a file
// several processes wrote is digested by parts in the manifest).
std::map<std::string, std::string> tensor_digests(const std::string& dir) {
  std::ifstream f(dir + "/manifest.json");
  const nlohmann::json m = nlohmann::json::parse(f);
  std::map<std::string, std::string> out;
  for (const auto& [name, entry] : m.at("files").items()) {
    if (name.ends_with(".safetensors") || name.ends_with(".index.json")) {
      out[name] = shardwise::ckpt::digest_file(dir + "/" + name, false).xxh64;
    }
  }
  return out;
}

// 4 processes save stage 1 v2 on dp=4: each writes only its ranges of the moments into the shared
// files, which are byte for byte those of plain dp=4 on 4 processes (stage 1 updates each element
// as plain dp does, from the same all-reduced gradients); resumed on dp=2 x tp=2 (v2 cuts other
// ranges, read straight from the files) the run continues the uninterrupted curve.
TEST(TrainMpi, AStageOneV2CheckpointOfFourProcessesIsPlainDpsFilesAndResumesOnDp2Tp2) {
  const char* bin = std::getenv("SHARDWISE_BIN");
  ASSERT_NE(bin, nullptr);
  const std::string args = " --layers 2 --hidden 32 --steps 8 --save-every 4 --global-batch 8 --lr 0.003 --warmup 3"
                           " --eval-every 0 ";
  const std::string root = tmp("shardwise-shard-save-mpi");
  std::system(("rm -rf " + root).c_str());
  auto mpirun = [&](const std::string& name, const std::string& extra) {
    const std::string cmd = std::string(SHARDWISE_MPIRUN_LINE) + " -np 4 " + bin + " train" + args + extra +
                            " --run-dir " + root + "/" + name + " > " + root + "-" + name + ".log 2>&1";
    return std::system(cmd.c_str());
  };
  ASSERT_EQ(mpirun("plain", "--mesh dp=4"), 0) << "see " << root << "-plain.log";
  ASSERT_EQ(mpirun("v2", "--mesh dp=4 --sharding-stage 1 --sharding-layout v2"), 0) << "see " << root << "-v2.log";
  const std::string saved = root + "/v2/checkpoints/checkpoint-4";
  const auto digests = tensor_digests(root + "/plain/checkpoints/checkpoint-4");
  EXPECT_EQ(digests.count("optimizer.safetensors.index.json"), 1u);
  EXPECT_EQ(tensor_digests(saved), digests);
  ASSERT_EQ(mpirun("resumed", "--mesh dp=2,tp=2 --sharding-stage 1 --sharding-layout v2 --resume " + saved), 0)
      << "see " << root << "-resumed.log";
  const std::vector<double> whole = losses_of(root + "/v2/metrics.jsonl"), rest = losses_of(root + "/resumed/metrics.jsonl");
  ASSERT_EQ(whole.size(), 8u);
  ASSERT_EQ(rest.size(), 4u);
  for (size_t i = 0; i < rest.size(); ++i) EXPECT_NEAR(rest[i], whole[4 + i], 1e-5 * whole[4 + i]) << "step " << 5 + i;
  std::system(("rm -rf " + root).c_str());
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
    std::system(("rm -rf " + tmp("shardwise-overlap-mpi-ref") + " " + tmp("shardwise-overlap-mpi-on") + " " + tmp("shardwise-overlap-mpi-after")).c_str());
    ASSERT_EQ(std::system((std::string(bin) + " train --mesh " + mesh + args +
                           "--run-dir " + tmp("shardwise-overlap-mpi-ref") + " > /dev/null").c_str()), 0);
    std::vector<double> ref = losses_of(tmp("shardwise-overlap-mpi-ref/metrics.jsonl"));
    ASSERT_EQ(ref.size(), 10u);
    std::vector<double> runs[2];
    for (int k = 0; k < 2; ++k) {
      const std::string mode = k == 0 ? "on" : "after";
      std::string mpi = std::string(SHARDWISE_MPIRUN_LINE) + " -np 4 " + bin + " train --mesh " + mesh + args + sharding +
                        " --overlap-grad-reduce " + mode + " --run-dir " + tmp("shardwise-overlap-mpi-") + mode +
                        " > " + tmp("shardwise-overlap-mpi.log") + " 2>&1";
      ASSERT_EQ(std::system(mpi.c_str()), 0) << "see " + tmp("shardwise-overlap-mpi.log");
      runs[k] = losses_of(tmp("shardwise-overlap-mpi-") + mode + "/metrics.jsonl");
      ASSERT_EQ(runs[k].size(), 10u);
    }
    EXPECT_EQ(runs[0], runs[1]) << mesh << " " << sharding;
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(runs[0][i], ref[i], 1e-5 * ref[i]) << mesh << " " << sharding << " step " << i + 1;
    std::ifstream log(tmp("shardwise-overlap-mpi.log"));
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
  const std::string data = token_file(tmp("shardwise-loader-mpi.bin"), 4000);
  const std::string args = " --layers 2 --hidden 32 --seq 16 --steps 6 --global-batch 8 --lr 0.003 --warmup 3"
                           " --eval-every 2 --val-fraction 0.2 --val-samples 5 --save-every 3 --data " + data +
                           " --mesh dp=2,tp=2 ";
  std::system(("rm -rf " + tmp("shardwise-loader-threads") + " " + tmp("shardwise-loader-hooked") + " " + tmp("shardwise-loader-mpi") + " " +
              tmp("shardwise-loader-mpi-bad")).c_str());
  ASSERT_EQ(std::system((std::string(bin) + " train" + args + "--run-dir " + tmp("shardwise-loader-threads") + " > /dev/null").c_str()), 0);
  const std::string hooked = "SHARDWISE_TEST_UNREADABLE_FOR_RANKS=1,3 " + std::string(bin) + " train" + args +
                             "--run-dir " + tmp("shardwise-loader-hooked") + " > " + tmp("shardwise-loader-hooked.log") + " 2>&1";
  ASSERT_EQ(std::system(hooked.c_str()), 0) << "see " + tmp("shardwise-loader-hooked.log");
  const std::string mpi = "SHARDWISE_TEST_UNREADABLE_FOR_RANKS=1,3 " + std::string(SHARDWISE_MPIRUN_LINE) + " -np 4 " +
                          bin + " train" + args;
  ASSERT_EQ(std::system((mpi + "--run-dir " + tmp("shardwise-loader-mpi") + " > " + tmp("shardwise-loader-mpi.log") + " 2>&1").c_str()), 0)
      << "see " + tmp("shardwise-loader-mpi.log");
  for (const std::string key : {"loss", "val_loss"}) {
    std::vector<double> ref = losses_of(tmp("shardwise-loader-threads/metrics.jsonl"), key);
    ASSERT_EQ(ref.size(), key == "loss" ? 6u : 3u) << key;
    for (const std::string& run : {tmp("shardwise-loader-hooked"), tmp("shardwise-loader-mpi")}) {
      std::vector<double> got = losses_of(run + "/metrics.jsonl", key);
      ASSERT_EQ(got.size(), ref.size()) << run << " " << key;
      for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(got[i], ref[i], 1e-6 * ref[i]) << run << " " << key << " " << i;
    }
  }
  EXPECT_EQ(std::system(("test -d " + tmp("shardwise-loader-mpi/checkpoints/checkpoint-6")).c_str()), 0);
  // The hook bites: a reader listed (process 2) fails as it opens the file; every process stops naming it.
  const std::string bad = "SHARDWISE_TEST_UNREADABLE_FOR_RANKS=2 " + std::string(SHARDWISE_MPIRUN_LINE) + " -np 4 " +
                          bin + " train" + args + "--run-dir " + tmp("shardwise-loader-mpi-bad") + " > " + tmp("shardwise-loader-bad.log") + " 2>&1";
  EXPECT_NE(std::system(bad.c_str()), 0);
  std::ifstream log(tmp("shardwise-loader-bad.log"));
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
    const std::string dir = std::string(tmp("shardwise-recompute-mpi-")) + mode;
    std::system(("rm -rf " + dir).c_str());
    std::string cmd = std::string(SHARDWISE_MPIRUN_LINE) + " -np 4 " + bin + " train" + args + "--recompute " + mode +
                      " --run-dir " + dir + " > " + dir + ".log 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << "see " << dir << ".log";
    curves.push_back(losses_of(dir + "/metrics.jsonl"));
    ASSERT_EQ(curves.back().size(), 3u) << mode;
  }
  EXPECT_EQ(curves[1], curves[0]);
}

// A usage error of an mpirun job (a mistyped option: CLI11's parse error; a value train refuses
// before it starts) is printed once, by the job's first process, with the exit status 2 that every
// process returns; before, 2 to 4 processes each printed it, their lines sometimes run together.
TEST(TrainMpi, AUsageErrorIsPrintedOnceWithStatus2) {
  const char* bin = std::getenv("SHARDWISE_BIN");
  ASSERT_NE(bin, nullptr);
  for (const std::string& args : {std::string("train --stesp 3"), std::string("train --mesh dp=4 --steps 0")}) {
    shardwise_cli_test::Result r =
        shardwise_cli_test::run_command(std::string(SHARDWISE_MPIRUN_LINE) + " -np 4 " + bin + " " + args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.out;
    size_t count = 0;
    for (size_t at = r.out.find("shardwise: error:"); at != std::string::npos; at = r.out.find("shardwise: error:", at + 1))
      ++count;
    EXPECT_EQ(count, 1u) << args << "\n" << r.out;
  }
  shardwise_cli_test::Result typo = shardwise_cli_test::run_command(std::string(SHARDWISE_MPIRUN_LINE) + " -np 2 " + bin +
                                                                    " train --stesp 3");
  EXPECT_NE(typo.out.find("shardwise: error: unknown option '--stesp'"), std::string::npos) << typo.out;
}

// A process of an mpirun job other than the first says nothing of a usage error and waits before it
// exits with 2, so that mpirun, which stops the job when one process exits non-zero, does not stop
// the first before it has printed the error (the test above failed so under load: 0 lines).
TEST(TrainMpi, AUsageErrorWaitsOnTheOtherProcessesForTheFirstToSayIt) {
  const char* bin = std::getenv("SHARDWISE_BIN");
  ASSERT_NE(bin, nullptr);
  const auto start = std::chrono::steady_clock::now();
  shardwise_cli_test::Result r =
      shardwise_cli_test::run_command(std::string("OMPI_COMM_WORLD_RANK=1 ") + bin + " train --stesp 3");
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(r.out.find("shardwise: error:"), std::string::npos) << r.out;
  EXPECT_GE(waited, 4.5);
  shardwise_cli_test::Result first =
      shardwise_cli_test::run_command(std::string("OMPI_COMM_WORLD_RANK=0 ") + bin + " train --stesp 3");
  EXPECT_EQ(first.status, 2) << first.out;
  EXPECT_NE(first.out.find("shardwise: error: unknown option '--stesp'"), std::string::npos) << first.out;
}
