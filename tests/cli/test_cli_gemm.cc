// `shardwise gemm-check` and `--gemm`: every backend checked against float64 in a child process,
// a wrong or crashing candidate reported and never chosen, the choice cached per machine, and the
// run header saying which library runs and why (the user's OPENBLAS_CORETYPE wins over auto; only
// an explicit --gemm overrides it).
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "run_cli.h"

namespace {

namespace fs = std::filesystem;
using shardwise_cli_test::Result;
using shardwise_cli_test::run_command;

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("sw_cli_gemm_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// `shardwise <args>` with SHARDWISE_GEMM unset (the suite sets it) and `env` in its environment.
Result sw(const std::string& env, const std::string& args) {
  const char* bin = std::getenv("SHARDWISE_BIN");
  return run_command("env -u SHARDWISE_GEMM -u OPENBLAS_CORETYPE " + env + " " + (bin ? bin : "shardwise") + " " + args);
}

std::string tiny_train(const fs::path& dir) {
  return "train --layers 1 --hidden 32 --heads 2 --steps 2 --global-batch 4 --eval-every 2 --progress none --run-dir " +
         (dir / "run").string();
}

// --quick is a gate of `make test`: every backend that can run here must pass (one that is not
// installed is reported, not counted); a planted wrong or crashing kernel fails it, naming the
// backend. The crash is reported as its signal with and without AddressSanitizer.
TEST(CliGemm, QuickCheckFailsOnAnyWrongOrCrashingBackendNamingIt) {
  const std::string two = "gemm-check --quick --candidates openblas,openblas-haswell";
  Result r = sw("", two);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("\nopenblas          OpenBLAS"), std::string::npos) << r.out;  // as wide as openblas-haswell
  EXPECT_NE(r.out.find("quick check done: every installed backend passed (openblas, openblas-haswell;"),
            std::string::npos) << r.out;
  r = sw("SHARDWISE_GEMM_CHECK_FAULT=openblas-haswell:wrong", two);
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("pass ("), std::string::npos) << r.out;  // openblas
  EXPECT_NE(r.out.find("FAIL on 1 thread:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("quick check FAILED: every installed backend must pass; failed: openblas-haswell\n"),
            std::string::npos) << r.out;
  r = sw("SHARDWISE_GEMM_CHECK_FAULT=openblas:crash", two);
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("crashed (Segmentation fault)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("DEADLYSIGNAL"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("quick check FAILED: every installed backend must pass; failed: openblas\n"), std::string::npos)
      << r.out;
  r = sw("SHARDWISE_GEMM_CHECK_FAULT=openblas-haswell:missing", two);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("not installed (planted"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("every installed backend passed (openblas;"), std::string::npos) << r.out;
  r = sw("SHARDWISE_GEMM_CHECK_FAULT=openblas:crash", "gemm-check --quick --candidates openblas");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("failed: openblas\n"), std::string::npos) << r.out;
}

TEST(CliGemm, AutoUsesTheCachedChoiceAndNeverAFailedCandidate) {
  fs::path dir = fresh_dir("auto");
  const std::string env = "XDG_CACHE_HOME=" + (dir / "cache").string();
  // Nothing cached: OpenBLAS's own pick, without measuring anything (no cache is written).
  Result first = sw(env, tiny_train(dir));
  ASSERT_EQ(first.status, 0) << first.out;
  EXPECT_NE(first.out.find("gemm: openblas = OpenBLAS"), std::string::npos) << first.out;
  EXPECT_NE(first.out.find("; no choice cached: run `shardwise gemm-check`\n"), std::string::npos) << first.out;
  EXPECT_FALSE(fs::exists(dir / "cache" / "shardwise" / "gemm.json"));
  // openblas-zen returns a wrong element: it is reported, left unmeasured and not chosen.
  Result r = sw(env + " SHARDWISE_GEMM_CHECK_FAULT=openblas-zen:wrong",
                "gemm-check --shape small --candidates openblas-zen,openblas-haswell");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("chosen: openblas-haswell"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(dir / "cache" / "shardwise" / "gemm.json"));
  r = sw(env, tiny_train(dir));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("gemm: openblas-haswell = OpenBLAS"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(core Haswell)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("chosen by check and measurement"), std::string::npos) << r.out;
}

// Without a cached choice every run says so: in one line of at most 100 characters (it wrapped to
// three), printed once, by rank 0, under mpirun too.
TEST(CliGemm, TheNoChoiceCachedNoticeIsOneShortLineOncePerRun) {
  fs::path dir = fresh_dir("notice");
  const std::string env = "XDG_CACHE_HOME=" + (dir / "cache").string();
  for (const std::string& launch : {std::string(), std::string(SHARDWISE_MPIRUN_LINE) + " -np 2 "}) {
    const char* bin = std::getenv("SHARDWISE_BIN");
    Result r = run_command("env -u SHARDWISE_GEMM -u OPENBLAS_CORETYPE " + env + " " + launch + (bin ? bin : "shardwise") +
                           " train --mesh dp=2 --layers 1 --hidden 32 --heads 2 --steps 2 --global-batch 4 "
                           "--eval-every 0 --progress lines --run-dir " + (dir / ("run" + std::to_string(launch.size()))).string());
    ASSERT_EQ(r.status, 0) << r.out;
    std::vector<std::string> notices;
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);)
      if (line.find("gemm") != std::string::npos && line.find("gemm-check") != std::string::npos) notices.push_back(line);
    ASSERT_EQ(notices.size(), 1u) << launch << "\n" << r.out;
    EXPECT_LE(notices[0].size(), 100u) << notices[0];
    EXPECT_TRUE(notices[0].starts_with("  gemm: openblas = OpenBLAS")) << notices[0];
  }
}

TEST(CliGemm, TheUsersOpenblasCoretypeWinsOverAutoAndOnlyGemmOverridesIt) {
  fs::path dir = fresh_dir("env");
  Result r = sw("OPENBLAS_CORETYPE=Haswell", tiny_train(dir) + " --gemm auto");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("gemm: openblas = OpenBLAS"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(core Haswell)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the user's OPENBLAS_CORETYPE=Haswell"), std::string::npos) << r.out;
  r = sw("OPENBLAS_CORETYPE=Haswell", tiny_train(dir) + " --gemm openblas-zen");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("(core Zen)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("; --gemm openblas-zen (command line or config)"), std::string::npos) << r.out;
  r = sw("SHARDWISE_GEMM=openblas-haswell", tiny_train(dir));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("(core Haswell)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("SHARDWISE_GEMM=openblas-haswell"), std::string::npos) << r.out;
}

// oneDNN's OpenMP runtime loads with OMP_WAIT_POLICY=PASSIVE unless the user set the variable.
TEST(CliGemm, OnednnLoadsOpenmpPassiveUnlessTheUserSetTheWaitPolicy) {
  fs::path dir = fresh_dir("omp");
  Result r = sw("", tiny_train(dir) + " --gemm onednn");
  if (r.status == 2 && r.out.find("cannot load libdnnl.so.2") != std::string::npos)
    GTEST_SKIP() << "oneDNN is not installed here (make deps installs libdnnl-dev): " << r.out;
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("gemm: onednn = oneDNN 2."), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(OpenMP wait policy passive)"), std::string::npos) << r.out;
  r = sw("OMP_WAIT_POLICY=ACTIVE", tiny_train(dir) + " --gemm onednn");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("(the user's OMP_WAIT_POLICY=ACTIVE)"), std::string::npos) << r.out;
}

TEST(CliGemm, AnUnknownBackendIsRefusedNamingTheAllowedOnes) {
  fs::path dir = fresh_dir("bad");
  Result r = sw("", tiny_train(dir) + " --gemm mkl");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("unknown gemm backend 'mkl' (allowed: auto, openblas,"), std::string::npos) << r.out;
  r = sw("", "gemm-check --quick --candidates openblas,mkl");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--candidates: unknown gemm backend 'mkl'"), std::string::npos) << r.out;
}

}  // namespace
