// Blocks held in flat ranges (a sharded optimizer's moments): each rank gives only elements
// [begin, begin + count) of its block, seen flat. The boxes of a range are checked against a
// row-major walk written here; saves from ranges give byte-identical files to saves from whole
// blocks (the existing writer), and loads of ranges give the elements of the global tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "ckpt_test_util.h"
#include "shardwise/ckpt/box_runs.h"
#include "shardwise/ckpt/checksum.h"
#include "shardwise/ckpt/commit.h"
#include "shardwise/ckpt/group_reader.h"
#include "shardwise/ckpt/manifest.h"
#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"

namespace shardwise::ckpt {
namespace {

using namespace testing;

// The flat offsets in `block` of the elements of `box`, in the box's row-major order.
std::vector<int64_t> flat_offsets(const reshard::Box& block, const reshard::Box& box) {
  std::vector<int64_t> out;
  const int n = block.shape.ndim();
  for (int64_t e = 0; e < box.numel(); ++e) {
    int64_t rest = e, flat = 0, stride = 1;
    for (int d = n - 1; d >= 0; --d) {
      auto i = static_cast<size_t>(d);
      const int64_t idx = rest % box.shape[d];
      rest /= box.shape[d];
      flat += (box.offset[i] + idx - block.offset[i]) * stride;
      stride *= block.shape[d];
    }
    out.push_back(flat);
  }
  return out;
}

TEST(FlatRanges, BoxesHoldExactlyTheRangeInFlatOrder) {
  for (const Shape& shape : {Shape{}, Shape{7}, Shape{4, 5}, Shape{3, 4, 5}, Shape{2, 1, 3, 4}, Shape{3, 0, 2}}) {
    reshard::Box block;
    block.shape = shape;
    for (int d = 0; d < shape.ndim(); ++d) block.offset[static_cast<size_t>(d)] = 3 + d;  // not at the origin
    const int64_t numel = shape.numel();
    for (int64_t begin = 0; begin <= numel; ++begin) {
      for (int64_t count = 0; begin + count <= numel; ++count) {
        std::vector<reshard::Box> boxes = flat_range_boxes(block, begin, count);
        std::vector<int64_t> got;
        for (const reshard::Box& b : boxes) {
          std::vector<int64_t> part = flat_offsets(block, b);
          // Each box is contiguous in the block: its elements follow one another.
          for (size_t k = 1; k < part.size(); ++k) ASSERT_EQ(part[k], part[k - 1] + 1) << shape.to_string();
          got.insert(got.end(), part.begin(), part.end());
        }
        std::vector<int64_t> want(static_cast<size_t>(count));
        std::iota(want.begin(), want.end(), begin);
        ASSERT_EQ(got, want) << shape.to_string() << " [" << begin << ", " << begin + count << ")";
        EXPECT_LE(static_cast<int>(boxes.size()), std::max(1, 2 * shape.ndim() - 1)) << shape.to_string();
      }
    }
  }
}

// The range a holder of a block gives: holder k of m cuts the block into m near-equal ranges (uneven
// ones start and end mid-row). `paired`: holders 2j and 2j+1 give the same range (a range held by
// two ranks, as tp-replicated parameters under a dp-sharded optimizer are).
FlatRange range_of_holder(int64_t numel, size_t k, size_t m, bool paired) {
  if (paired) k /= 2, m = (m + 1) / 2;
  const auto lo = numel * static_cast<int64_t>(k) / static_cast<int64_t>(m);
  const auto hi = numel * static_cast<int64_t>(k + 1) / static_cast<int64_t>(m);
  return {lo, hi - lo};
}

// Every tensor but every third one is given in ranges of its block, whatever its placement.
struct RangedContent {
  CheckpointContent content;
  std::map<std::string, FlatRange> ranges;  // by tensor name, this rank's
};

RangedContent ranged_content(const std::vector<GlobalTensor>& model, const Topology& topo, int rank, bool paired) {
  RangedContent out{content_for(model, topo, rank, 3), {}};
  size_t index = 0;
  for (TensorGroup& g : out.content.groups) {
    for (DistTensor& t : g.tensors) {
      if (index++ % 3 == 2 || !t.layout.mesh.contains(rank)) continue;
      // The processes holding the same block as this rank, in process order.
      const auto mine = reshard::block_at(t.global_shape, t.layout, coords_of(t.layout, rank));
      std::vector<int64_t> holders;
      for (int64_t p : t.layout.mesh.process_ids()) {
        const auto b = reshard::block_at(t.global_shape, t.layout, coords_of(t.layout, p));
        if (b.shape == mine.shape && std::equal(b.offset.begin(), b.offset.end(), mine.offset.begin())) holders.push_back(p);
      }
      std::sort(holders.begin(), holders.end());
      const auto k = static_cast<size_t>(std::find(holders.begin(), holders.end(), rank) - holders.begin());
      const FlatRange r = range_of_holder(mine.numel(), k, holders.size(), paired);
      // The range's elements, 1-D, from the whole block.
      const Tensor block = t.local;
      Tensor part = Tensor::uninitialized(t.dtype, Shape{r.count});
      if (r.count > 0)
        std::memcpy(part.raw(), block.raw() + static_cast<size_t>(r.begin) * dtype_size(t.dtype),
                    static_cast<size_t>(r.count) * dtype_size(t.dtype));
      t.local = part;
      t.range = r;
      out.ranges[t.name] = r;
    }
  }
  return out;
}

std::map<std::string, std::string> file_digests(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.ends_with(".safetensors") || name.ends_with(".index.json")) out[name] = digest_file(e.path(), false).xxh64;
  }
  return out;
}

TEST(FlatRanges, RangesSaveTheFilesOfWholeBlocksAndLoadBackOnEveryTopology) {
  auto model = small_model();
  for (const Topology& topo : topologies()) {
    for (bool paired : {false, true}) {
      const std::string what = topo.label + (paired ? " paired" : "");
      ScratchDir whole("whole"), ranged("ranged");
      SaveOptions options;
      options.max_shard_bytes = 300;  // several shards per group
      const int n = static_cast<int>(mesh::parse_mesh(topo.mesh).size());
      comm::LocalWorld::run(n, [&](comm::Communicator& c) {
        save_checkpoint(c, whole.path, content_for(model, topo, c.rank(), 3), options);
        RangedContent r = ranged_content(model, topo, c.rank(), paired);
        save_checkpoint(c, ranged.path, r.content, options);
        // Each rank loads its ranges back: the global tensor's elements of its block.
        for (const char* group : {"model", "optimizer", "master_weights"}) {
          std::vector<LoadSpec> specs;
          for (const auto& t : model) {
            if (t.group != group) continue;
            LoadSpec s{t.name, t.value.shape(), t.value.dtype(), layout_of(topo, t.name)};
            if (r.ranges.count(t.name)) s.range = r.ranges.at(t.name);
            specs.push_back(s);
          }
          auto loaded = load_group(ranged.path / "checkpoint-3", group, specs, c.rank());
          for (const auto& t : model) {
            if (t.group != group || !r.ranges.count(t.name)) continue;
            const FlatRange fr = r.ranges.at(t.name);
            const Tensor block = block_of(t.value, layout_of(topo, t.name), c.rank());
            const Tensor& got = loaded.at(t.name);
            ASSERT_EQ(got.shape(), Shape{fr.count}) << what << " " << t.name;
            for (int64_t j = 0; j < fr.count; ++j)
              ASSERT_EQ(got.at(j), block.at(fr.begin + j)) << what << " rank " << c.rank() << " " << t.name << " " << j;
          }
        }
      });
      EXPECT_EQ(file_digests(ranged.path / "checkpoint-3"), file_digests(whole.path / "checkpoint-3")) << what;
      EXPECT_TRUE(verify_checkpoint(ranged.path / "checkpoint-3").ok()) << what;
    }
  }
}

// A stacked tensor stored as slices (MoE experts [E, ...] under per-expert keys) given in flat
// ranges that cut across the slices mid-row (a sharded optimizer's moments of experts): the files
// equal those of a whole-block save, and each rank's range loads back out of the slices.
TEST(FlatRanges, RangesAcrossSlicesOfAStackedTensor) {
  ScratchDir whole("slices_whole"), ranged("slices_ranged");
  const Tensor global = make_global(DType::F32, Shape{4, 3, 5}, 7);  // 4 slices of 3 x 5
  const reshard::Layout l{mesh::parse_mesh("dp=2"), mesh::parse_dist("R", 1)};
  KeyMap keys;
  keys.place_slices("experts/exp_avg", global.shape(), {"e.0", "e.1", "e.2", "e.3"});
  const FlatRange mine[2] = {{0, 23}, {23, 37}};  // 23 = slice 1, row 1, column 3
  comm::LocalWorld::run(2, [&](comm::Communicator& c) {
    CheckpointContent w;
    w.step = 1;
    w.groups.push_back({"optimizer", {{"experts/exp_avg", global.shape(), DType::F32, l, global}}, keys});
    save_checkpoint(c, whole.path, w);
    const FlatRange r = mine[c.rank()];
    Tensor part = Tensor::uninitialized(DType::F32, Shape{r.count});
    std::memcpy(part.raw(), global.raw() + r.begin * 4, static_cast<size_t>(r.count) * 4);
    CheckpointContent content;
    content.step = 1;
    content.groups.push_back({"optimizer", {{"experts/exp_avg", global.shape(), DType::F32, l, part, r}}, keys});
    save_checkpoint(c, ranged.path, content);
    LoadOptions options;
    options.keys = keys;
    LoadSpec spec{"experts/exp_avg", global.shape(), DType::F32, l};
    spec.range = r;
    auto loaded = load_group(ranged.path / "checkpoint-1", "optimizer", {&spec, 1}, c.rank(), options);
    const Tensor& got = loaded.at("experts/exp_avg");
    ASSERT_EQ(got.shape(), Shape{r.count});
    for (int64_t j = 0; j < r.count; ++j) ASSERT_EQ(got.at(j), global.at(r.begin + j)) << "rank " << c.rank() << " " << j;
  });
  EXPECT_EQ(file_digests(ranged.path / "checkpoint-1"), file_digests(whole.path / "checkpoint-1"));
}

TEST(FlatRanges, RangesThatLeaveAHoleAreRefusedOnEveryRankNamingTheElements) {
  ScratchDir scratch("hole");
  const Tensor global = make_global(DType::F32, Shape{5, 4}, 1);
  const mesh::ProcessMesh m = mesh::parse_mesh("dp=2");
  const reshard::Layout l{m, mesh::parse_dist("R", 1)};
  std::vector<std::string> errors(2);
  comm::LocalWorld::run(2, [&](comm::Communicator& c) {
    // Rank 0 holds [0, 7), rank 1 [9, 20): elements 7 and 8 are nobody's.
    const FlatRange r = c.rank() == 0 ? FlatRange{0, 7} : FlatRange{9, 11};
    Tensor part = Tensor::uninitialized(DType::F32, Shape{r.count});
    std::memcpy(part.raw(), global.raw() + r.begin * 4, static_cast<size_t>(r.count) * 4);
    CheckpointContent content;
    content.step = 1;
    content.groups.push_back({"optimizer", {{"w/exp_avg", global.shape(), DType::F32, l, part, r}}, {}});
    try {
      save_checkpoint(c, scratch.path, content);
    } catch (const Error& e) {
      errors[static_cast<size_t>(c.rank())] = e.what();
    }
  });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("tensor 'w/exp_avg' of group 'optimizer': elements [7, 9) of the block 5x4 at 0,0"), std::string::npos) << e;
    EXPECT_NE(e.find("leave a hole"), std::string::npos) << e;
  }
  EXPECT_EQ(errors[0], errors[1]);
  EXPECT_FALSE(fs::exists(scratch.path / "checkpoint-1"));
  EXPECT_FALSE(fs::exists(scratch.path / "checkpoint-1.tmp"));
  // A range outside the block, or not held 1-D, is refused too.
  comm::LocalWorld::run(1, [&](comm::Communicator& c) {
    const reshard::Layout one{mesh::parse_mesh("1"), mesh::parse_dist("R", 1)};
    CheckpointContent content;
    content.step = 2;
    content.groups.push_back({"optimizer", {{"w", global.shape(), DType::F32, one, Tensor(DType::F32, Shape{6}), FlatRange{16, 6}}}, {}});
    try {
      save_checkpoint(c, scratch.path, content);
      ADD_FAILURE() << "saved";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("holds elements [16, 22) of its block 5x4, which has 20 elements"),
                std::string::npos) << e.what();
    }
    content.groups[0].tensors[0].range = FlatRange{0, 6};
    content.groups[0].tensors[0].local = Tensor(DType::F32, Shape{2, 3});
    try {
      save_checkpoint(c, scratch.path, content);
      ADD_FAILURE() << "saved";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("a range is held 1-D"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace shardwise::ckpt
