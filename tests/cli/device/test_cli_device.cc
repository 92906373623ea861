// `shardwise train --device`: `--device fake` (the tests' device standing in for cuda:0) writes the
// losses and gradient norms of `--device cpu` bit for bit, with the addition task's evaluation and a
// checkpoint that `--device cpu` resumes, validation, packed documents, Mixtral's router and sp; the header and metrics.jsonl name the device; what a
// device cannot run yet, an unknown device, cuda without a GPU or a CUDA build, and GPUs under mpirun
// without NCCL or with one GPU for two processes are usage errors (status 2) naming the option, before
// any work. MPI processes on the fake device write the CPU processes' curve and checkpoint, through a
// world routed as MPI + NCCL's (the test switch) too.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "../run_cli.h"
#include "shardwise/cli/train/train_device.h"

namespace {

namespace fs = std::filesystem;
using shardwise_cli_test::metrics_losses;
using shardwise_cli_test::Result;
using shardwise_cli_test::run;
using shardwise_cli_test::TempDir;

// metrics.jsonl's values of `key` by line, as written (text: compares bit for bit).
std::vector<std::string> field_of(const fs::path& metrics, const std::string& key) {
  std::vector<std::string> out;
  std::ifstream f(metrics);
  const std::string tag = "\"" + key + "\":";
  for (std::string line; std::getline(f, line);) {
    const size_t at = line.find(tag);
    if (at == std::string::npos) continue;
    const size_t from = at + tag.size();
    out.push_back(line.substr(from, line.find_first_of(",}", from) - from));
  }
  return out;
}

const std::string kTiny = " --layers 2 --hidden 32 --heads 4 --global-batch 8 --lr 0.003 --warmup 2 --eval-every 4 ";

TEST(TrainDevice, FakeWritesTheCpuCurveAndACheckpointTheCpuResumes) {
  for (const std::string model : {"gpt2", "llama"}) {
    for (const std::string mesh : {"dp=1", "dp=2", "tp=2"}) {
      TempDir cpu("sw_dev_cpu"), dev("sw_dev_fake");
      const std::string args = "train --model " + model + " --mesh " + mesh + kTiny + "--steps 4 --save-every 2 ";
      const Result a = run(args + "--run-dir " + cpu.path.string());
      ASSERT_EQ(a.status, 0) << a.out;
      const Result b = run(args + "--device fake --run-dir " + dev.path.string());
      ASSERT_EQ(b.status, 0) << b.out;
      EXPECT_NE(b.out.find("device: fake"), std::string::npos) << b.out;
      EXPECT_EQ(a.out.find("device:"), std::string::npos) << a.out;
      const fs::path ma = cpu.path / "metrics.jsonl", mb = dev.path / "metrics.jsonl";
      EXPECT_EQ(metrics_losses(mb), metrics_losses(ma)) << model << " " << mesh;
      EXPECT_EQ(field_of(mb, "grad_norm"), field_of(ma, "grad_norm")) << model << " " << mesh;
      EXPECT_EQ(field_of(mb, "accuracy"), field_of(ma, "accuracy")) << model << " " << mesh;
      EXPECT_EQ(field_of(mb, "device"), std::vector<std::string>(4, "\"fake\""));
      EXPECT_TRUE(field_of(ma, "device").empty());
      // The device allocator's peak in use, every step: never falling, at least the parameters and
      // AdamW's two moments (f32: over twice the saved model file), none on the CPU.
      const std::vector<std::string> peaks = field_of(mb, "device_peak_bytes");
      ASSERT_EQ(peaks.size(), 4u) << model << " " << mesh;
      const auto model_file = static_cast<int64_t>(
          fs::file_size(dev.path / "checkpoints" / "checkpoint-2" / "model-00001-of-00001.safetensors"));
      for (size_t k = 0; k < peaks.size(); ++k) {
        EXPECT_GT(std::stoll(peaks[k]), 2 * model_file) << model << " " << mesh << " step " << k + 1;
        if (k > 0) {
          EXPECT_GE(std::stoll(peaks[k]), std::stoll(peaks[k - 1])) << model << " " << mesh;
        }
      }
      EXPECT_TRUE(field_of(ma, "device_peak_bytes").empty());
      // The fake run's checkpoint of step 2, resumed on the CPU: the CPU's steps 3 and 4.
      TempDir resumed("sw_dev_resumed");
      const Result c = run("train --resume " + (dev.path / "checkpoints" / "checkpoint-2").string() + " --run-dir " +
                           resumed.path.string());
      ASSERT_EQ(c.status, 0) << c.out;
      const std::vector<std::string> all = metrics_losses(ma), rest = metrics_losses(resumed.path / "metrics.jsonl");
      ASSERT_GE(rest.size(), 2u) << c.out;
      ASSERT_EQ(all.size(), 4u);
      EXPECT_EQ(std::vector<std::string>(rest.end() - 2, rest.end()), std::vector<std::string>(all.begin() + 2, all.end()))
          << model << " " << mesh;
    }
  }
}

TEST(TrainDevice, FakeValidatesAndPacksDocumentsAsTheCpu) {
  const std::string data = std::string(SHARDWISE_SOURCE_DIR) + "/tests/data/fables.txt";
  for (const std::string extra : {"--mesh dp=2 --val-fraction 0.1 --eval-every 2",
                                  "--model llama --experts 4 --top-k 2 --mesh tp=2 --sp --eos-id 10 --no-cross-document-attention"}) {
    TempDir cpu("sw_dev_val_cpu"), dev("sw_dev_val_fake");
    const std::string args = "train --layers 2 --hidden 32 --heads 4 --steps 4 --seq 32 --vocab 256 --global-batch 8 --data " +
                             data + " --data-format bytes " + extra + " ";
    const Result a = run(args + "--run-dir " + cpu.path.string());
    ASSERT_EQ(a.status, 0) << a.out;
    const Result b = run(args + "--device fake --run-dir " + dev.path.string());
    ASSERT_EQ(b.status, 0) << b.out;
    for (const std::string key : {"loss", "grad_norm", "val_loss", "moe"})
      EXPECT_EQ(field_of(dev.path / "metrics.jsonl", key), field_of(cpu.path / "metrics.jsonl", key)) << extra << ": " << key;
    const bool validates = extra.find("--val-fraction") != std::string::npos;
    EXPECT_EQ(field_of(dev.path / "metrics.jsonl", validates ? "val_loss" : "moe").size(), validates ? 2u : 4u) << extra;
  }
}

struct Refusal {
  std::string args, says;
};

TEST(TrainDevice, WhatADeviceCannotRunIsAUsageErrorNamingTheOption) {
  const char* cuda_said[] = {"no GPU is visible", "built without CUDA"};
  const std::vector<Refusal> refusals = {
      {"--device tpu", "--device 'tpu': use cpu, cuda, cuda:N or fake"},
      {"--device cuda:x", "--device cuda:x: a GPU is cuda or cuda:N"},
  };
  for (const Refusal& r : refusals) {
    const Result res = run("train --layers 1 --hidden 32 --steps 1 " + r.args + " --run-dir " + shardwise_cli_test::tmp("sw_dev_refused"));
    EXPECT_EQ(res.status, 2) << r.args << ": " << res.out;
    EXPECT_NE(res.out.find(r.says), std::string::npos) << r.args << ": " << res.out;
    EXPECT_EQ(res.out.find("step 1"), std::string::npos) << r.args << ": it trained: " << res.out;
  }
  // This machine has no GPU: a CUDA build says so, a build without CUDA says that.
  const Result cuda = run("train --layers 1 --hidden 32 --steps 1 --device cuda --run-dir " + shardwise_cli_test::tmp("sw_dev_cuda"));
  EXPECT_EQ(cuda.status, 2) << cuda.out;
  EXPECT_TRUE(cuda.out.find(cuda_said[0]) != std::string::npos || cuda.out.find(cuda_said[1]) != std::string::npos) << cuda.out;
  EXPECT_NE(cuda.out.find("--device cuda"), std::string::npos) << cuda.out;
}

// The file's bytes ("" when it does not exist).
std::string bytes_of(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// "routed world: rank R: D calls on the device side (mpi), H on the host side (mpi)" of each rank
// in `out`, as {D, H} by rank.
std::vector<std::pair<long, long>> routes_of(const std::string& out) {
  std::vector<std::pair<long, long>> by_rank;
  for (size_t at = out.find("routed world: rank "); at != std::string::npos; at = out.find("routed world: rank ", at + 1)) {
    int rank = -1;
    long device = -1, host = -1;
    if (std::sscanf(out.c_str() + at, "routed world: rank %d: %ld calls on the device side (mpi), %ld on the host side (mpi)",
                    &rank, &device, &host) != 3 || rank < 0)
      continue;
    if (by_rank.size() <= static_cast<size_t>(rank)) by_rank.resize(static_cast<size_t>(rank) + 1, {-1, -1});
    by_rank[static_cast<size_t>(rank)] = {device, host};
  }
  return by_rank;
}

// `args` (with --steps 4 --save-every 2) as 2 MPI processes on the CPU and on the fake device:
// the same losses and gradient norms, and checkpoint-4's safetensors files byte for byte. With
// `routed`, again with the test switch SHARDWISE_TEST_ROUTE_DEVICE_COMM=1 (cli/train/train_world.h):
// the world is a RoutedComm of the MPI world and a duplicate of it, the CPU's stand-in for MPI +
// NCCL on GPUs; the same bits prove that every device-buffer call is made under a DeviceBuffers
// scope (an unscoped one would reach the host side with PROT_NONE fake-device memory and die), and
// each rank's routes show calls on both sides.
void expect_mpi_fake_equals_cpu(const std::string& args, bool routed = false) {
  const char* bin = std::getenv("SHARDWISE_BIN");
  ASSERT_NE(bin, nullptr);
  TempDir cpu("sw_dev_mpi_cpu"), dev("sw_dev_mpi_fake"), via("sw_dev_mpi_routed");
  const std::string tail = " -np 2 " + std::string(bin) + " train " + args + " --hidden 32 --heads 4 --steps 4 --save-every 2 --run-dir ";
  const std::string line = std::string(SHARDWISE_MPIRUN_LINE) + tail;
  const Result a = shardwise_cli_test::run_command(line + cpu.path.string());
  ASSERT_EQ(a.status, 0) << a.out;
  const Result b = shardwise_cli_test::run_command(line + dev.path.string() + " --device fake");
  ASSERT_EQ(b.status, 0) << b.out;
  EXPECT_TRUE(routes_of(b.out).empty()) << b.out;
  std::vector<fs::path> runs = {dev.path};
  if (routed) {
    const Result c = shardwise_cli_test::run_command(std::string(SHARDWISE_MPIRUN_LINE) +
                                                     " -x SHARDWISE_TEST_ROUTE_DEVICE_COMM=1" + tail + via.path.string() +
                                                     " --device fake");
    ASSERT_EQ(c.status, 0) << c.out;
    const std::vector<std::pair<long, long>> routes = routes_of(c.out);
    ASSERT_EQ(routes.size(), 2u) << c.out;
    for (const auto& [device, host] : routes) {
      EXPECT_GT(device, 0) << args << ": calls on the device side\n" << c.out;
      EXPECT_GT(host, 0) << args << ": calls on the host side\n" << c.out;
    }
    runs.push_back(via.path);
  }
  const fs::path ma = cpu.path / "metrics.jsonl";
  ASSERT_EQ(metrics_losses(ma).size(), 4u) << args;
  for (const fs::path& run : runs) {
    const fs::path mb = run / "metrics.jsonl";
    EXPECT_EQ(metrics_losses(mb), metrics_losses(ma)) << args << ": " << run;
    EXPECT_EQ(field_of(mb, "grad_norm"), field_of(ma, "grad_norm")) << args << ": " << run;
    EXPECT_EQ(field_of(mb, "device"), std::vector<std::string>(4, "\"fake\"")) << args << ": " << run;
    int files = 0;
    for (const auto& e : fs::directory_iterator(cpu.path / "checkpoints" / "checkpoint-4")) {
      if (e.path().extension() != ".safetensors") continue;
      ++files;
      EXPECT_EQ(bytes_of(run / "checkpoints" / "checkpoint-4" / e.path().filename()), bytes_of(e.path()))
          << args << ": " << run << ": " << e.path().filename();
    }
    EXPECT_GT(files, 0) << args;
  }
}

// MPI processes on the fake device: their collectives stage device buffers through the host
// (comm/device_staging.h), and give the CPU processes' curve and checkpoint bit for bit; dp with
// gradient buckets and tp under bf16 compute (these two also through the routed world), sharding
// stage 2 (reduce-scatter buckets) and stage 3.
TEST(TrainDevice, MpiProcessesOnTheFakeDeviceWriteTheCpuProcessesCurveAndCheckpoint) {
  expect_mpi_fake_equals_cpu("--mesh dp=2 --overlap-grad-reduce on --layers 2", true);
  expect_mpi_fake_equals_cpu("--mesh tp=2 --model llama --bf16 --compute bf16 --layers 2", true);
  for (const std::string args : {"--mesh dp=2 --sharding-stage 2 --sharding-layout v2 --overlap-grad-reduce on --bf16 --layers 2",
                                 "--mesh dp=2 --model llama --sharding-stage 3 --prefetch-params 1 --layers 2"})
    expect_mpi_fake_equals_cpu(args);
}

// Expert parallelism over 2 MPI processes on the fake device (Mixtral tiny: Llama with 4 experts,
// top 2): the MoE kernel's counts all-gathered and rows moved by all_to_all_v on device buffers,
// staged through the host by MPI, and through the routed world (every such call under a
// DeviceBuffers scope); f32 and --bf16 --compute bf16: the CPU processes' curve and checkpoint.
TEST(TrainDevice, MpiExpertParallelOnTheFakeDeviceWritesTheCpuProcessesCurveAndCheckpoint) {
  expect_mpi_fake_equals_cpu("--mesh ep=2 --model llama --experts 4 --top-k 2 --layers 2", true);
  expect_mpi_fake_equals_cpu("--mesh ep=2 --model llama --experts 4 --top-k 2 --bf16 --compute bf16 --layers 2");
}

// Context parallelism over 2 MPI processes on the fake device: ring attention's blocks go to the
// other process as device buffers staged through the host (and, through the routed world, on its
// device side); the CPU processes' curve and checkpoint bit for bit.
TEST(TrainDevice, MpiContextParallelOnTheFakeDeviceWritesTheCpuProcessesCurveAndCheckpoint) {
  expect_mpi_fake_equals_cpu("--mesh cp=2 --model llama --bf16 --seq 16 --layers 2", true);
}

// A pipeline of 2 MPI processes on the fake device: each stage's activations and gradients go to
// the other process as device buffers staged through the host, as GPT-2's tied embedding gradient
// (its first and last stage on different processes; 3 layers, an uneven split); the CPU processes'
// curve and checkpoint bit for bit.
TEST(TrainDevice, MpiPipelineOnTheFakeDeviceWritesTheCpuProcessesCurveAndCheckpoint) {
  for (const std::string args : {"--mesh pp=2 --layers 3", "--mesh pp=2 --model llama --bf16 --schedule zbh1 --layers 2"})
    expect_mpi_fake_equals_cpu(args);
}

// GPUs under mpirun: where NCCL is built, each process takes its node's GPU of its local rank
// (--device cuda; this machine has none: use_device's refusal) and cuda:N, one GPU, is refused for
// two processes; a build without NCCL refuses the run naming SHARDWISE_WITH_NCCL.
TEST(TrainDevice, UnderMpirunAGpuNeedsNcclAndOneGpuAProcess) {
  const char* bin = std::getenv("SHARDWISE_BIN");
  ASSERT_NE(bin, nullptr);
  for (const std::string device : {"cuda", "cuda:1"}) {
    const std::string line = std::string(SHARDWISE_MPIRUN_LINE) + " -np 2 " + bin +
                             " train --mesh dp=2 --layers 1 --hidden 32 --steps 1 --device " + device + " --run-dir " +
                             shardwise_cli_test::tmp("sw_dev_mpi");
    const Result r = shardwise_cli_test::run_command(line);
    EXPECT_NE(r.status, 0) << r.out;
    EXPECT_EQ(r.out.find("step 1"), std::string::npos) << device << ": it trained: " << r.out;
#ifdef SHARDWISE_TEST_CLI_NCCL
    const std::string says = device == "cuda" ? "--device cuda: no GPU is visible"
                                              : "--device cuda:1 under mpirun: cuda:N names one GPU, but each of the 2 "
                                                "processes needs its own; use --device cuda";
#else
    const std::string says = "--device " + device + " under mpirun: MPI processes on GPUs need NCCL as their "
                             "communicator, and this shardwise was built without it (SHARDWISE_WITH_NCCL";
#endif
    EXPECT_NE(r.out.find(says), std::string::npos) << r.out;
  }
}

// Rank threads share one GPU: where the process sees several, the header says the others stay idle
// and how to use them (a process each under mpirun); with one GPU, or one rank, it says nothing more.
TEST(TrainDevice, RankThreadsOnOneOfSeveralGpusSayTheOthersStayIdle) {
  EXPECT_EQ(shardwise::cli::threads_on_one_gpu(4, 1), "4 rank threads on it");
  EXPECT_EQ(shardwise::cli::threads_on_one_gpu(1, 8), "1 rank on it");
  const std::string eight = shardwise::cli::threads_on_one_gpu(4, 8);
  EXPECT_NE(eight.find("4 rank threads on it; the other 7 GPUs this process sees stay idle"), std::string::npos) << eight;
  EXPECT_NE(eight.find("mpirun -np 4 shardwise train --device cuda"), std::string::npos) << eight;
  EXPECT_NE(shardwise::cli::threads_on_one_gpu(16, 8).find("mpirun -np 8 "), std::string::npos);
}

// --profile on the fake device: the op table as on the CPU, and the allocator line is the device
// allocator's (its peak in use as metrics.jsonl's device_peak_bytes), not the host's.
TEST(TrainDevice, TheProfileOfADeviceRunShowsTheDevicesAllocator) {
  TempDir cpu("sw_prof_cpu"), dev("sw_prof_fake");
  const std::string args = "train --layers 1 --hidden 32 --steps 2 --profile --run-dir ";
  const Result a = run(args + cpu.path.string());
  ASSERT_EQ(a.status, 0) << a.out;
  const Result b = run(args + dev.path.string() + " --device fake");
  ASSERT_EQ(b.status, 0) << b.out;
  EXPECT_NE(a.out.find("  allocator: reserved"), std::string::npos) << a.out;
  EXPECT_NE(b.out.find("op matmul"), std::string::npos) << b.out;
  const size_t at = b.out.find("  device allocator (cuda:0): reserved ");
  ASSERT_NE(at, std::string::npos) << b.out;
  const std::vector<std::string> peaks = field_of(dev.path / "metrics.jsonl", "device_peak_bytes");
  ASSERT_EQ(peaks.size(), 2u);
  const double mib = static_cast<double>(std::stoll(peaks.back())) / (1 << 20);
  const std::string line = b.out.substr(at, b.out.find('\n', at) - at);
  EXPECT_NE(line.find(fmt::format("peak in use {:.1f} MiB", mib)), std::string::npos) << line;
}

}  // namespace
