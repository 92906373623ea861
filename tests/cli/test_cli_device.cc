// --device on the commands that run kernels (cli/device_option.h): `verify --device fake` checks
// what `--device cpu` checks, every check run on the device; `--device cuda` without CUDA or a GPU
// is an error before any work, saying which.
#include <gtest/gtest.h>

#include <regex>

#include "run_cli.h"

namespace {

using shardwise_cli_test::run;

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

TEST(CliDevice, AnUnknownDeviceNamesTheChoices) {
  auto r = run("verify --device gpu --op gelu");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("cpu,fake,cuda"), std::string::npos) << r.out;
}

}  // namespace
