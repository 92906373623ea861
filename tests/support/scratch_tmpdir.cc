// Every test binary of tests/<layer> runs in a scratch directory of its own: before the first test
// a fresh `shardwise-test-XXXXXX` under $TMPDIR (or /tmp) becomes TMPDIR for this process and what
// it starts (the shardwise binary, mpirun), so fs::temp_directory_path() and the tests' named
// paths cannot meet another run's: two checkouts, or two ctest jobs, testing at once. It is removed
// when every test passed or it is empty, and kept (and named) when a test failed, for its logs.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>

namespace {

class ScratchTmpdir : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* base = std::getenv("TMPDIR");
    std::string templ = std::string(base && *base ? base : "/tmp") + "/shardwise-test-XXXXXX";
    if (!::mkdtemp(templ.data())) {
      std::perror(("cannot make a scratch directory " + templ).c_str());
      return;  // the tests run in the inherited TMPDIR
    }
    dir_ = templ;
    ::setenv("TMPDIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    if (dir_.empty()) return;
    std::error_code ec;
    if (std::filesystem::remove(dir_, ec)) return;  // empty: nothing to keep
    if (!::testing::UnitTest::GetInstance()->Passed()) {
      std::fprintf(stderr, "kept the tests' scratch directory %s\n", dir_.c_str());
      return;
    }
    std::filesystem::remove_all(dir_, ec);
  }

 private:
  std::string dir_;
};

[[maybe_unused]] ::testing::Environment* const kScratch = ::testing::AddGlobalTestEnvironment(new ScratchTmpdir);

}  // namespace
