// Every registered op's rule, proven on meshes [2], [3], [2,2], [2,3]: forward, gradient and
// reverse, even and uneven shapes, zero failures. One test per op, so ctest runs them in
// parallel; each writes its coverage rows to verify_coverage/<op>.txt (make test prints them).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "shardwise/verify/verifier.h"

namespace shardwise::verify {
namespace {

class EveryRule : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryRule, IsNumericallyRightOnEveryMesh) {
  const ops::OpDef& op = ops::op_registry().get(GetParam());
  Report report = verify_op(op);
  std::filesystem::create_directories("verify_coverage");
  std::ofstream(fmt::format("verify_coverage/{}.txt", op.name)) << report.table();
  EXPECT_TRUE(report.ok()) << report.table();
  for (const Coverage& row : report.rows) {
    EXPECT_GT(row.forward, 0) << op.name << " on " << row.mesh;
    EXPECT_GT(row.reverse, 0) << op.name << " on " << row.mesh;
    if (op.has_backward()) {
      EXPECT_GT(row.grad, 0) << op.name << " on " << row.mesh;
    }
    // The cases must include shapes that divide every split, shapes that do not, and a dim
    // smaller than the mesh (empty shards).
    EXPECT_TRUE(row.even) << op.name << " has no case whose dims all divide mesh " << row.mesh;
    EXPECT_TRUE(row.uneven) << op.name << " has no case with a dim that does not divide mesh " << row.mesh;
    EXPECT_TRUE(row.empty_shards) << op.name << " has no case with a dim smaller than mesh " << row.mesh;
  }
}

std::vector<std::string> op_names() {
  std::vector<std::string> names;
  for (const ops::OpDef* op : ops::op_registry().all()) names.push_back(op->name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(Ops, EveryRule, ::testing::ValuesIn(op_names()),
                         [](const auto& info) { return info.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(EveryRule);

TEST(EveryRule, EveryOpHoldsACompleteRuleAndHasCases) {
  for (const ops::OpDef* op : ops::op_registry().all()) {
    EXPECT_TRUE(!op->rule.name.empty() && op->rule.forward && op->rule.reverse && op->rule.grad)
        << op->name << " holds an incomplete rule '" << op->rule.name << "'";
    EXPECT_FALSE(op->cases.empty()) << op->name << " has no verification cases";
  }
}

}  // namespace
}  // namespace shardwise::verify
