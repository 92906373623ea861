// The environment every test binary of tests/<layer> runs in, set before main (and so before the
// GEMM library is loaded, which reads its thread count then), for this process and what it starts:
// OpenBLAS runs each call on one thread (OPENBLAS_NUM_THREADS=1: a rank's GEMMs are split by its
// own pool, and a test's reference is one library call on one thread), and the suite runs on
// OpenBLAS's own pick (SHARDWISE_GEMM=openblas) whatever this machine's cached `--gemm auto` choice
// is; no test measures (tests/cli/test_cli_gemm.cc covers auto). These were once ctest ENVIRONMENT
// properties, of which gtest_discover_tests kept only the first (CMake passes a list property on as
// separate words), so the suite ran on OpenBLAS's default threads.
#include <stdlib.h>

namespace {

[[maybe_unused]] const bool kSuiteEnvironment = [] {
  ::setenv("OPENBLAS_NUM_THREADS", "1", 1);
  ::setenv("SHARDWISE_GEMM", "openblas", 1);
  return true;
}();

}  // namespace
