// calibrate's note on a collective measured on a busy machine (plan/calibrate.h): the points of
// one machine's collective pass; a slow smallest message or a larger message much faster than a
// smaller one is named, with the advice to calibrate again.
#include <gtest/gtest.h>

#include "shardwise/plan/calibrate.h"

namespace shardwise::plan {
namespace {

TEST(CalibrateNotes, ABusyMachinesCollectiveIsNamedAndAQuietOnesIsNot) {
  const std::vector<double> bytes = {4096, 524288, 16777216};
  // Open MPI on 2 processes of the quiet dev VM (2026-11-29 08:55): all_reduce.
  EXPECT_EQ(noisy_collective_note(bytes, {3.375e-6, 8.6189e-05, 0.003606953}), "");
  // The same at load 9 (10:09): 4 KiB took 48 ms, more than 512 KiB's 40 ms.
  const std::string slow = noisy_collective_note(bytes, {0.048044535, 0.040249523, 0.051977504});
  EXPECT_NE(slow.find("4096 B took 48.0 ms"), std::string::npos) << slow;
  EXPECT_NE(slow.find("calibrate again on a quiet machine"), std::string::npos) << slow;
  // reduce_scatter at load 9: 28 ms for 4 KiB is named first; a fast 4 KiB but a 512 KiB ten times
  // faster than it cannot be one machine's.
  EXPECT_NE(noisy_collective_note(bytes, {0.027950539, 0.002222887, 0.059901548}).find("4096 B"), std::string::npos);
  const std::string inverted = noisy_collective_note(bytes, {2e-4, 2e-5, 3e-3});
  EXPECT_NE(inverted.find("4096 B took 0.2 ms, 524288 B 0.02 ms"), std::string::npos) << inverted;
}

}  // namespace
}  // namespace shardwise::plan
