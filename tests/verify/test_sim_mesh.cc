#include <gtest/gtest.h>

#include "shardwise/verify/sim_mesh.h"

namespace shardwise::verify {
namespace {

using mesh::DistAttr;
using mesh::ProcessMesh;

std::vector<DistAttr> all_dists(int tensor_ndim, const ProcessMesh& mesh) {
  std::vector<mesh::Placement> opts = {mesh::Placement::replicate()};
  for (int d = 0; d < tensor_ndim; ++d) opts.push_back(mesh::Placement::shard(d));
  for (auto op : {mesh::ReduceOp::Sum, mesh::ReduceOp::Avg, mesh::ReduceOp::Max, mesh::ReduceOp::Min}) {
    opts.push_back(mesh::Placement::partial(op));
  }
  std::vector<DistAttr> out;
  for (auto& a : opts) {
    for (auto& b : opts) out.push_back(DistAttr{a, b});
  }
  return out;
}

TEST(SimMesh, DistributeThenAssembleGivesBackTheTensor) {
  ProcessMesh mesh(Shape{2, 3});
  for (DType dtype : {DType::F64, DType::I32}) {
    Tensor x = random_tensor(Shape{7, 2}, dtype, {ops::ValueGen::Kind::Uniform, -3, 3}, Philox(1, 2));
    for (const DistAttr& d : all_dists(2, mesh)) {
      std::vector<Tensor> parts = distribute(x, d, mesh, Philox(3, 4));
      std::string error;
      Tensor back = assemble(parts, x.shape(), dtype, d, mesh, error);
      ASSERT_TRUE(back.defined()) << d.to_string() << ": " << error;
      EXPECT_TRUE(compare(back, x, 1e-12, 1e-12).equal) << d.to_string();
    }
  }
}

TEST(SimMesh, PartialPartsAreUnequalAndReduceCorrectly) {
  ProcessMesh mesh(Shape{3});
  Tensor x = Tensor::from<double>(Shape{4}, {1.0, -2.0, 3.5, 0.0});
  std::vector<Tensor> sum = distribute(x, DistAttr{mesh::Placement::partial()}, mesh, Philox(9, 9));
  for (int64_t i = 0; i < 4; ++i) {
    double total = sum[0].at(i) + sum[1].at(i) + sum[2].at(i);
    EXPECT_NEAR(total, x.at(i), 1e-12);
    EXPECT_NE(sum[0].at(i), sum[1].at(i));  // never equal thirds
  }
  std::vector<Tensor> mx = distribute(x, DistAttr{mesh::Placement::partial(mesh::ReduceOp::Max)}, mesh, Philox(9, 9));
  for (int64_t i = 0; i < 4; ++i) {
    double m = std::max({mx[0].at(i), mx[1].at(i), mx[2].at(i)});
    EXPECT_EQ(m, x.at(i));
    int below = (mx[0].at(i) < x.at(i)) + (mx[1].at(i) < x.at(i)) + (mx[2].at(i) < x.at(i));
    EXPECT_GE(below, 1);
  }
  std::vector<Tensor> avg = distribute(x, DistAttr{mesh::Placement::partial(mesh::ReduceOp::Avg)}, mesh, Philox(9, 9));
  EXPECT_NEAR((avg[0].at(2) + avg[1].at(2) + avg[2].at(2)) / 3, 3.5, 1e-12);
}

TEST(SimMesh, AssembleRejectsWrongShapesAndDivergentReplicas) {
  ProcessMesh mesh(Shape{2});
  Tensor x = Tensor::from<double>(Shape{4}, {1, 2, 3, 4});
  std::string error;
  // Claiming Shard(0) for full-size local tensors: shape mismatch.
  EXPECT_FALSE(assemble({x, x}, x.shape(), DType::F64, DistAttr{mesh::Placement::shard(0)}, mesh, error).defined());
  EXPECT_NE(error.find("rank 0 holds"), std::string::npos);
  // Claiming Replicate for two different tensors.
  Tensor y = x.clone();
  y.set_at(3, 5);
  EXPECT_FALSE(assemble({x, y}, x.shape(), DType::F64, DistAttr{mesh::Placement::replicate()}, mesh, error).defined());
  EXPECT_NE(error.find("differ"), std::string::npos);
}

}  // namespace
}  // namespace shardwise::verify
