// Stacked tensors stored as slices (key_map.h, KeyMap::place_slices): an [E, I, H] tensor split
// over ep on dim 0 is kept as E stored tensors [I, H] (Mixtral's per-expert keys). Each stored
// slice is checked against Tensor::slice of the global made here, each writer against the slices
// its block holds, and loads on other meshes against blocks cut from the global.
#include <gtest/gtest.h>

#include <sstream>

#include "ckpt_test_util.h"
#include "shardwise/ckpt/group_reader.h"
#include "shardwise/ckpt/manifest.h"
#include "shardwise/ckpt/save_plan.h"
#include "shardwise/ckpt/tools.h"
#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"

namespace shardwise::ckpt {
namespace {

using namespace testing;

constexpr int64_t E = 4, I = 3, H = 5;

std::string slice_key(const std::string& w, int64_t e) { return fmt::format("experts.{}.{}.weight", e, w); }

KeyMap slices_map() {
  KeyMap m;
  for (const char* w : {"w1", "w2"}) {
    std::vector<std::string> keys;
    for (int64_t e = 0; e < E; ++e) keys.push_back(slice_key(w, e));
    m.place_slices(fmt::format("experts.{}", w), std::string(w) == "w1" ? Shape{E, I, H} : Shape{E, H, I}, keys);
  }
  return m;
}

std::map<std::string, Tensor> globals() {
  return {{"experts.w1", make_global(DType::F32, Shape{E, I, H}, 1)},
          {"experts.w2", make_global(DType::F32, Shape{E, H, I}, 2)},
          {"gate.weight", make_global(DType::F32, Shape{E, H}, 3)}};
}

// The experts S(0) on ep (and on a dim named "row" S(1), a sub-slice cut), the router replicated.
reshard::Layout layout(const std::string& mesh_text, const std::string& name) {
  mesh::ProcessMesh m = mesh::parse_mesh(mesh_text);
  std::vector<std::string> d(static_cast<size_t>(m.ndim()), "R");
  for (size_t i = 0; i < d.size(); ++i) {
    if (name == "gate.weight") continue;
    if (m.dim_names()[i] == "ep") d[i] = "S(0)";
    if (m.dim_names()[i] == "row") d[i] = "S(1)";
  }
  return {m, mesh::parse_dist(fmt::format("{}", fmt::join(d, ",")), m.ndim())};
}

CheckpointContent content_on(const std::string& mesh_text, int rank) {
  CheckpointContent content;
  content.step = 1;
  TensorGroup group{"model", {}, slices_map()};
  for (const auto& [name, value] : globals()) {
    reshard::Layout l = layout(mesh_text, name);
    group.tensors.push_back({name, value.shape(), DType::F32, l, block_of(value, l, rank)});
  }
  content.groups.push_back(group);
  return content;
}

TEST(KeySlices, EachSliceIsItsExpertOnEveryLayoutAndLoadsOnEveryOther) {
  const auto g = globals();
  const std::vector<std::string> meshes = {"1", "ep=2", "ep=4", "dp=2,ep=2", "ep=2,row=2", "dp=2"};
  for (const std::string& from : meshes) {
    ScratchDir scratch("keyslices");
    comm::LocalWorld::run(static_cast<int>(mesh::parse_mesh(from).size()), [&](comm::Communicator& c) {
      save_checkpoint(c, scratch.path, content_on(from, c.rank()));
    });
    fs::path dir = scratch.path / "checkpoint-1";
    ASSERT_TRUE(verify_checkpoint(dir).ok()) << from;
    GroupReader reader(dir, "model");
    EXPECT_EQ(reader.names().size(), 2 * E + 1) << from;
    for (int64_t e = 0; e < E; ++e) {
      for (const char* w : {"w1", "w2"}) {
        const Tensor& whole = g.at(fmt::format("experts.{}", w));
        const Shape rest = std::string(w) == "w1" ? Shape{I, H} : Shape{H, I};
        const int64_t at[] = {e, 0, 0};
        Tensor want = whole.slice(at, Shape{1, rest[0], rest[1]});
        Tensor got = reader.file_of(slice_key(w, e)).read(slice_key(w, e));
        ASSERT_EQ(got.shape(), rest) << from;
        EXPECT_EQ(std::memcmp(got.raw(), want.raw(), static_cast<size_t>(got.numel()) * 4), 0)
            << from << " " << slice_key(w, e);
      }
    }
    EXPECT_EQ(KeyMap::from_json(load_json(dir, kManifestName)["key_maps"]["model"]).to_json(), slices_map().to_json());
    for (const std::string& to : meshes) {
      comm::LocalWorld::run(static_cast<int>(mesh::parse_mesh(to).size()), [&](comm::Communicator& c) {
        std::vector<LoadSpec> specs;
        for (const auto& [name, value] : g) specs.push_back({name, value.shape(), DType::F32, layout(to, name)});
        LoadOptions o;
        o.keys = slices_map();
        auto loaded = load_group(dir, "model", specs, c.rank(), o);
        for (const auto& [name, value] : g) {
          EXPECT_TRUE(bit_equal(loaded.at(name), block_of(value, layout(to, name), c.rank())))
              << from << " -> " << to << " " << name;
        }
      });
    }
  }
}

TEST(KeySlices, AnEpRankWritesOnlyItsExpertsKeys) {
  // On dp=2 x ep=2 rank (dp, ep) holds experts [2 ep, 2 ep + 2): every piece of a slice it is told
  // to write is of one of its experts, and each stored slice gets exactly its bytes.
  ScratchDir scratch("keyslices_own");
  const std::string mesh_text = "dp=2,ep=2";
  comm::LocalWorld::run(4, [&](comm::Communicator& c) {
    CheckpointContent content = content_on(mesh_text, c.rank());
    SaveOptions options;
    options.split_bytes = 0;  // replicas (dp) split their blocks
    detail::SavePlan plan = detail::plan_save(c, scratch.path, content, options);
    std::map<std::string, int64_t> bytes;  // stored key -> bytes planned
    for (const detail::Piece& p : plan.pieces) {
      const DistTensor& t = content.groups[p.group].tensors[p.tensor];
      const std::string& key = plan.files[p.file].layout.tensors[p.entry].name;
      bytes[key] += static_cast<int64_t>(p.bytes);
      if (t.name == "gate.weight") continue;
      const int64_t ep = p.writer % 2, e = p.box.offset[0];
      EXPECT_EQ(p.box.shape[0], 1) << key;
      EXPECT_TRUE(e >= 2 * ep && e < 2 * ep + 2) << key << " written by rank " << p.writer;
      EXPECT_EQ(key, slice_key(t.name.substr(8), e));
    }
    for (int64_t e = 0; e < E; ++e) EXPECT_EQ(bytes[slice_key("w1", e)], I * H * 4);
  });
}

TEST(KeySlices, InspectShowsEachSliceAndMergeKeepsTheTable) {
  ScratchDir scratch("keyslices_tools");
  comm::LocalWorld::run(2, [&](comm::Communicator& c) { save_checkpoint(c, scratch.path, content_on("ep=2", c.rank())); });
  const fs::path dir = scratch.path / "checkpoint-1";
  std::ostringstream out;
  inspect(dir, out);
  EXPECT_NE(out.str().find("experts.2.w1.weight"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("= experts.w1[2] of 4x3x5"), std::string::npos) << out.str();
  merge_checkpoint(dir, scratch.path / "merged");
  EXPECT_EQ(load_json(scratch.path / "merged", kManifestName)["key_maps"]["model"], slices_map().to_json());
  RewriteOptions without_one;
  without_one.remove_keys = {"experts.3.w2.weight"};  // w2 loses a slice: its entry goes, w1's stays
  merge_checkpoint(dir, scratch.path / "partial", without_one);
  const nlohmann::json kept = load_json(scratch.path / "partial", kManifestName)["key_maps"]["model"];
  EXPECT_TRUE(kept.contains("experts.w1"));
  EXPECT_FALSE(kept.contains("experts.w2"));
}

TEST(KeySlices, BadSlicesAreErrors) {
  KeyMap m;
  EXPECT_THROW(m.place_slices("w", Shape{2, 3}, {"a"}), Error);        // one key for two slices
  EXPECT_THROW(m.place_slices("w", Shape{2, 3}, {"a", "a"}), Error);   // a key twice
  m.place_slices("w", Shape{2, 3}, {"a", "b"});
  EXPECT_THROW(m.place_slices("w", Shape{2, 3}, {"c", "d"}), Error);   // twice
  m.place("v", Shape{3}, "a", Shape{3}, {0});                          // also in 'a': overlaps slice 0
  try {
    m.check_tiling();
    ADD_FAILURE() << "overlap accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'a'"), std::string::npos) << e.what();
  }
  // A load whose checkpoint lacks one slice names that key.
  ScratchDir scratch("keyslices_missing");
  comm::LocalWorld::run(1, [&](comm::Communicator& c) { save_checkpoint(c, scratch.path, content_on("1", c.rank())); });
  KeyMap more = slices_map();
  std::vector<std::string> keys;
  for (int64_t e = 0; e < E + 1; ++e) keys.push_back(slice_key("w3", e));
  more.place_slices("experts.w3", Shape{E + 1, I, H}, keys);
  std::vector<LoadSpec> specs;
  for (const auto& [name, value] : globals()) specs.push_back({name, value.shape(), DType::F32, layout("1", name)});
  specs.push_back({"experts.w3", Shape{E + 1, I, H}, DType::F32, layout("1", "experts.w3")});
  LoadOptions o;
  o.keys = more;
  try {
    load_group(scratch.path / "checkpoint-1", "model", specs, 0, o);
    ADD_FAILURE() << "missing slices accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("experts.4.w3.weight (part of experts.w3)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardwise::ckpt
