// --device on the commands that run kernels (cli/device_option.h): `verify --device fake` checks
// what `--device cpu` checks, every check run on the device; `generate --device fake` gives the
// CPU's tokens and logits (and transformers' greedy tokens) for the GPT-2 and Llama tiny checkpoints
// of tests/golden/hf, on one rank and on a pp=2 mesh; `--device cuda` without CUDA or a GPU is an
// error before any work, saying which.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <regex>

#include "../json_line.h"
#include "../run_cli.h"

namespace {

using shardwise_cli_test::Result;
using shardwise_cli_test::run;
using shardwise_cli_test::tmp;

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// The numbers of the summary line's "N forward, N grad, N reverse" and failures.
std::string counts(const std::string& out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex("total: [0-9]+ forward, [0-9]+ grad, [0-9]+ reverse placement "
                                            "combinations checked; [0-9]+ failures"))) {
    return "no summary line in: " + out;
  }
  return m.str();
}

TEST(CliDevice, VerifyOnTheFakeDeviceChecksWhatTheCpuChecksEveryCheckOnTheDevice) {
  const std::string args = "verify --op gelu,softmax,matmul --mesh 2 --mesh 2,2 --quiet";
  auto cpu = run(args + " --device cpu");
  auto fake = run(args + " --device fake");
  ASSERT_EQ(cpu.status, 0) << cpu.out;
  ASSERT_EQ(fake.status, 0) << fake.out;
  EXPECT_EQ(counts(fake.out), counts(cpu.out));
  EXPECT_NE(counts(cpu.out).find("; 0 failures"), std::string::npos) << cpu.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(fake.out, m, std::regex("on cuda:0 \\(fake kernels\\): ([0-9]+) checks ran on the "
                                                        "device \\([0-9]+ local kernel runs\\), 0 skipped")))
      << fake.out;
  EXPECT_GT(std::stoll(m[1]), 0);
  EXPECT_EQ(cpu.out.find("on cuda"), std::string::npos) << cpu.out;
}

TEST(CliDevice, VerifyOnCudaWithoutCudaOrAGpuIsAnErrorBeforeAnyWork) {
  auto r = run("verify --device cuda --op gelu --mesh 2");
  if (r.status == 0) GTEST_SKIP() << "a GPU is visible here: the check runs (tools/gpu_check.sh)";
  EXPECT_EQ(r.status, 2) << r.out;
  const bool no_build = r.out.find("--device cuda: this shardwise was built without CUDA") != std::string::npos;
  const bool no_gpu = r.out.find("--device cuda: no GPU is visible to this process") != std::string::npos;
  EXPECT_TRUE(no_build || no_gpu) << r.out;
  EXPECT_EQ(r.out.find("total:"), std::string::npos) << r.out;  // nothing verified
  EXPECT_EQ(r.out.find("forward"), std::string::npos) << r.out;
}

// `generate <args>` on the CPU and on the fake device: the same sequences and the same logits file
// (bit for bit); the fake run's JSON.
nlohmann::json expect_fake_as_cpu(const std::string& args, const std::string& what) {
  Result cpu = run(args + " --device cpu --logits-out " + tmp("cpu.safetensors"));
  Result fake = run(args + " --device fake --logits-out " + tmp("fake.safetensors"));
  EXPECT_EQ(cpu.status, 0) << cpu.out;
  EXPECT_EQ(fake.status, 0) << fake.out;
  if (cpu.status != 0 || fake.status != 0) return {};
  const nlohmann::json c = shardwise_cli_test::json_of(cpu), d = shardwise_cli_test::json_of(fake);
  EXPECT_EQ(c["device"], "host") << what;
  EXPECT_EQ(d["device"], "cuda:0") << what;
  EXPECT_EQ(d["sequences"], c["sequences"]) << what;
  EXPECT_EQ(file_bytes(tmp("fake.safetensors")), file_bytes(tmp("cpu.safetensors"))) << what << ": the logits";
  EXPECT_NE(fake.out.find("on fake (cuda:0))"), std::string::npos) << fake.out;
  return d;
}

const std::string kGolden = std::string(SHARDWISE_SOURCE_DIR) + "/tests/golden/hf/";

TEST(CliDevice, GenerateOnTheFakeDeviceGivesTheCpuTokensAndLogits) {
  for (const std::string name : {"gpt2_tiny", "llama_tiny"}) {
    const shardwise_cli_test::GoldenGreedy want = shardwise_cli_test::golden_greedy(kGolden, name);
    for (const std::string sampling : {"", " --top-k 20 --seed 7"}) {
      const std::string args = "generate --checkpoint " + kGolden + name + " --prompt-ids '" + want.prompt_ids +
                               ";3,4' --max-new-tokens 6 --eos-id -1 --json" + sampling;
      const std::string what = name + sampling;
      const nlohmann::json d = expect_fake_as_cpu(args, what);
      if (!sampling.empty() || d.is_null()) continue;
      std::vector<int64_t> greedy = want.prompt;
      const auto got = d["sequences"][0]["new_ids"].get<std::vector<int64_t>>();
      greedy.insert(greedy.end(), got.begin(), got.end());
      ASSERT_LE(greedy.size(), want.greedy.size()) << what;
      EXPECT_EQ(greedy, std::vector<int64_t>(want.greedy.begin(), want.greedy.begin() + std::ssize(greedy)))
          << what << ": transformers";
    }
  }
}

// A pp=2 mesh on the fake device (each stage's cache there, the residual stream handed over as
// device tensors) gives the CPU's pp=2 run, greedy and sampled.
TEST(CliDevice, GenerateOnAPpMeshOnTheFakeDeviceGivesTheCpuTokensAndLogits) {
  for (const std::string name : {"gpt2_tiny", "llama_tiny"}) {
    for (const std::string sampling : {"", " --top-k 20 --seed 7"}) {
      const std::string args = "generate --checkpoint " + kGolden + name +
                               " --prompt-ids '5,17,42;3,4' --max-new-tokens 6 --eos-id -1 --json --mesh pp=2" +
                               sampling;
      expect_fake_as_cpu(args, name + " on pp=2" + sampling);
    }
  }
}

TEST(CliDevice, GenerateOnCudaWithoutCudaOrAGpuIsAnErrorBeforeAnyWork) {
  auto cuda = run("generate --checkpoint " + kGolden + "llama_tiny --prompt-ids 1,2 --device cuda");
  if (cuda.status == 0) GTEST_SKIP() << "a GPU is visible here";
  EXPECT_EQ(cuda.status, 2) << cuda.out;
  EXPECT_NE(cuda.out.find("--device cuda: "), std::string::npos) << cuda.out;
  EXPECT_EQ(cuda.out.find(" | "), std::string::npos) << cuda.out;  // nothing generated
}

TEST(CliDevice, AnUnknownDeviceNamesTheChoices) {
  auto r = run("verify --device gpu --op gelu");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("cpu,fake,cuda"), std::string::npos) << r.out;
}

}  // namespace
