#include <gtest/gtest.h>

#include "shardwise/core/error.h"
#include "shardwise/mesh/dist_attr.h"
#include "shardwise/mesh/process_mesh.h"
#include "shardwise/mesh/shard_math.h"

namespace shardwise::mesh {
namespace {

TEST(ProcessMesh, CoordsNamesAndParsing) {
  ProcessMesh m = parse_mesh("dp=2,tp=3");
  EXPECT_EQ(m.size(), 6);
  EXPECT_EQ(m.dim_index("tp"), 1);
  EXPECT_EQ(m.dim_index("0"), 0);
  EXPECT_THROW(m.dim_index("pp"), Error);
  EXPECT_EQ(m.coords(5), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(m.rank_index(std::vector<int64_t>{1, 0}), 3);
  EXPECT_EQ(m.to_string(), "[dp=2,tp=3]");
  ProcessMesh custom(Shape{2, 2}, {4, 5, 6, 7});
  EXPECT_EQ(custom.rank_index_of_process(6), 2);
  EXPECT_THROW(custom.rank_index_of_process(0), Error);
  EXPECT_THROW(ProcessMesh(Shape{2, 2}, {0, 1, 2}), Error);
  EXPECT_THROW(ProcessMesh(Shape{2, 2}, {0, 1, 2, 2}), Error);
  EXPECT_THROW(parse_mesh("2,0"), Error);
  EXPECT_EQ(parse_mesh("2x3").shape(), (Shape{2, 3}));
}

// A [2, 3] mesh of processes 10..15 (row-major): the groups along each dim, written out by hand.
TEST(ProcessMesh, ProcessesAlongADimAreTheRanksThatDifferOnlyThere) {
  ProcessMesh m(Shape{2, 3}, {10, 11, 12, 13, 14, 15}, {"dp", "tp"});
  EXPECT_EQ(m.processes_along(14, 0), (std::vector<int64_t>{11, 14}));
  EXPECT_EQ(m.processes_along(14, 1), (std::vector<int64_t>{13, 14, 15}));
  EXPECT_EQ(m.processes_along(10, 1), (std::vector<int64_t>{10, 11, 12}));
  EXPECT_EQ(m.processes_along(12, -1), (std::vector<int64_t>{12}));
  EXPECT_THROW(m.processes_along(9, 0), Error);
}

TEST(Placement, ParseAndPrint) {
  EXPECT_EQ(parse_placement("S(1)"), Placement::shard(1));
  EXPECT_EQ(parse_placement("Shard(0)"), Placement::shard(0));
  EXPECT_EQ(parse_placement("P"), Placement::partial(ReduceOp::Sum));
  EXPECT_EQ(parse_placement("Partial(max)"), Placement::partial(ReduceOp::Max));
  EXPECT_EQ(parse_placement(" R "), Placement::replicate());
  EXPECT_EQ(Placement::partial(ReduceOp::Avg).to_string(), "P(avg)");
  EXPECT_THROW(parse_placement("S(x)"), Error);
  EXPECT_THROW(parse_placement("Q"), Error);
  EXPECT_THROW(parse_placement("P(prod)"), Error);
}

TEST(ChunkSemantics, CeilSizedLeadingShardsAndEmptyTrailingShards) {
  // n = 5 over 4: 2, 2, 1, 0 (torch.chunk).
  EXPECT_EQ(chunk_range(5, 4, 0).size, 2);
  EXPECT_EQ(chunk_range(5, 4, 2).offset, 4);
  EXPECT_EQ(chunk_range(5, 4, 2).size, 1);
  EXPECT_EQ(chunk_range(5, 4, 3).size, 0);
  EXPECT_EQ(chunk_range(5, 4, 3).offset, 5);
  // n = 1 over 3: 1, 0, 0.
  EXPECT_EQ(chunk_range(1, 3, 1).size, 0);
  EXPECT_EQ(chunk_range(12, 3, 2).offset, 8);
}

TEST(LocalBlock, CoShardingNestsInOrder) {
  ProcessMesh m(Shape{2, 3});
  // Tensor dim 0 (size 7) over mesh dims 0 then 1: 7 -> [4, 3]; 4 -> [2, 2, 0]; 3 -> [1, 1, 1].
  DistAttr d = parse_dist("S(0),S(0)");
  auto at = [&](int64_t r) { return local_block(Shape{7, 5}, d, m, m.coords(r)); };
  EXPECT_EQ(at(0).shape, (Shape{2, 5}));
  EXPECT_EQ(at(2).shape, (Shape{0, 5}));
  EXPECT_EQ(at(3).offset[0], 4);
  EXPECT_EQ(at(5).offset[0], 6);
  EXPECT_EQ(at(5).shape, (Shape{1, 5}));
  // The other order: mesh dim 1 first: 7 -> [3, 3, 1]; then mesh dim 0 halves each.
  DistAttr r = parse_dist("S(0)@1,S(0)@0");
  EXPECT_FALSE(r.has_default_order());
  EXPECT_EQ(r.to_string(), "S(0)@1,S(0)@0");
  EXPECT_EQ(r.mesh_dims_of(0)[0], 1);
  auto rt = [&](int64_t rank) { return local_block(Shape{7, 5}, r, m, m.coords(rank)); };
  EXPECT_EQ(rt(0).shape[0], 2);  // coords (0,0): chunk 0 of [0,3) halves -> [0,2)
  EXPECT_EQ(rt(3).offset[0], 2);  // coords (1,0): [2,3)
  EXPECT_EQ(rt(4).offset[0], 5);  // coords (1,1): chunk [3,6) second half -> [5,6)
  EXPECT_FALSE(r == d);
}

TEST(DistAttr, ValidationAndPaddleView) {
  DistAttr d = parse_dist("S(1),P(max)", 2);
  EXPECT_EQ(d.dims_mapping(2), (std::vector<int64_t>{-1, 0}));
  EXPECT_EQ(d.partial_status().at(1), ReduceOp::Max);
  EXPECT_EQ(DistAttr::from_dims_mapping(2, std::vector<int64_t>{-1, 0}, {{1, ReduceOp::Max}}), d);
  EXPECT_THROW(d.validate(1, 2), Error);  // S(1) on a rank-1 tensor
  EXPECT_THROW(d.validate(2, 3), Error);  // wrong mesh rank
  EXPECT_THROW(parse_dist("S(0),R", 3), Error);
  EXPECT_THROW(parse_dist("S(0),S(0)").dims_mapping(1), Error);  // co-sharded
  EXPECT_THROW(DistAttr::from_dims_mapping(2, std::vector<int64_t>{0, 0}), Error);
  EXPECT_THROW(parse_dist("S(0)@0,S(0)"), Error);
  DistAttr e(2);
  e.set(1, Placement::shard(0));
  e.set(0, Placement::shard(0));
  EXPECT_EQ(e, parse_dist("S(0),S(0)"));  // default order whatever the order of set() calls
  EXPECT_EQ(e.mesh_dims_of(0).size(), 2);
}

}  // namespace
}  // namespace shardwise::mesh
