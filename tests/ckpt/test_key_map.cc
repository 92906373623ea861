// Fused stored tensors (key_map.h): q, k, v placed side by side in one c_attn tensor, saved on
// several layouts with each rank writing only its own block's bytes, read back on others. The
// stored c_attn is checked against a concatenation made here (Tensor::slice of the globals), not
// against the code that writes it.
#include <gtest/gtest.h>

#include "ckpt_test_util.h"
#include "shardwise/ckpt/group_reader.h"
#include "shardwise/ckpt/manifest.h"
#include "shardwise/ckpt/save_plan.h"
#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"

namespace shardwise::ckpt {
namespace {

using namespace testing;

constexpr int64_t H = 6;  // q, k, v weights [H, H] -> c_attn [H, 3H]; biases [H] -> [3H]

KeyMap qkv_map() {
  KeyMap m;
  const char* parts[] = {"q", "k", "v"};
  for (int64_t i = 0; i < 3; ++i) {
    m.place(fmt::format("{}.weight", parts[i]), Shape{H, H}, "c_attn.weight", Shape{H, 3 * H}, {0, i * H});
    m.place(fmt::format("{}.bias", parts[i]), Shape{H}, "c_attn.bias", Shape{3 * H}, {i * H});
  }
  return m;
}

std::map<std::string, Tensor> globals() {
  std::map<std::string, Tensor> g;
  int seed = 1;
  for (const char* p : {"q", "k", "v"}) {
    g[fmt::format("{}.weight", p)] = make_global(DType::F32, Shape{H, H}, seed++);
    g[fmt::format("{}.bias", p)] = make_global(DType::F32, Shape{H}, seed++);
  }
  g["ln.weight"] = make_global(DType::F32, Shape{H}, seed++);
  return g;
}

// Column-parallel q/k/v (weights S(1), biases S(0) on tp), the rest replicated.
reshard::Layout layout(const std::string& mesh_text, const std::string& name) {
  mesh::ProcessMesh m = mesh::parse_mesh(mesh_text);
  std::vector<std::string> d(static_cast<size_t>(m.ndim()), "R");
  const auto& names = m.dim_names();
  for (size_t i = 0; i < d.size(); ++i) {
    if (names[i] == "tp" && name != "ln.weight") d[i] = name.ends_with("weight") ? "S(1)" : "S(0)";
  }
  return {m, mesh::parse_dist(fmt::format("{}", fmt::join(d, ",")), m.ndim())};
}

void save_on(const std::string& mesh_text, const fs::path& root, KeyMap keys, int64_t step = 1) {
  auto g = globals();
  comm::LocalWorld::run(static_cast<int>(mesh::parse_mesh(mesh_text).size()), [&](comm::Communicator& c) {
    CheckpointContent content;
    content.step = step;
    TensorGroup group{"model", {}, keys};
    for (const auto& [name, value] : g) {
      reshard::Layout l = layout(mesh_text, name);
      group.tensors.push_back({name, value.shape(), DType::F32, l, block_of(value, l, c.rank())});
    }
    content.groups.push_back(group);
    save_checkpoint(c, root, content);
  });
}

Tensor concat3(const std::string& suffix, const std::map<std::string, Tensor>& g) {
  const bool matrix = suffix == "weight";
  Tensor out(DType::F32, matrix ? Shape{H, 3 * H} : Shape{3 * H});
  int64_t i = 0;
  for (const char* p : {"q", "k", "v"}) {
    const Tensor& t = g.at(fmt::format("{}.{}", p, suffix));
    for (int64_t r = 0; r < (matrix ? H : 1); ++r) {
      for (int64_t col = 0; col < H; ++col) {
        int64_t dst = matrix ? r * 3 * H + i * H + col : i * H + col;
        out.set_at(dst, t.at(matrix ? r * H + col : col));
      }
    }
    ++i;
  }
  return out;
}

TEST(KeyMap, FusedTensorIsTheConcatenationOnEveryLayoutAndLoadsOnEveryOther) {
  const auto g = globals();
  const std::vector<std::string> meshes = {"1", "tp=2", "dp=2,tp=2", "tp=3", "dp=2"};
  for (const std::string& from : meshes) {
    ScratchDir scratch("keymap");
    save_on(from, scratch.path, qkv_map());
    fs::path dir = scratch.path / "checkpoint-1";
    ASSERT_TRUE(verify_checkpoint(dir).ok()) << from;
    GroupReader reader(dir, "model");
    EXPECT_EQ(reader.names(), (std::vector<std::string>{"c_attn.bias", "c_attn.weight", "ln.weight"})) << from;
    EXPECT_TRUE(bit_equal(reader.file_of("c_attn.weight").read("c_attn.weight"), concat3("weight", g))) << from;
    EXPECT_TRUE(bit_equal(reader.file_of("c_attn.bias").read("c_attn.bias"), concat3("bias", g))) << from;
    EXPECT_EQ(KeyMap::from_json(load_json(dir, kManifestName)["key_maps"]["model"]).to_json(), qkv_map().to_json());
    for (const std::string& to : meshes) {
      comm::LocalWorld::run(static_cast<int>(mesh::parse_mesh(to).size()), [&](comm::Communicator& c) {
        std::vector<LoadSpec> specs;
        for (const auto& [name, value] : g) specs.push_back({name, value.shape(), DType::F32, layout(to, name)});
        LoadOptions o;
        o.keys = qkv_map();
        auto loaded = load_group(dir, "model", specs, c.rank(), o);
        for (const auto& [name, value] : g) {
          EXPECT_TRUE(bit_equal(loaded.at(name), block_of(value, layout(to, name), c.rank())))
              << from << " -> " << to << " " << name;
        }
      });
    }
  }
}

TEST(KeyMap, EachRankWritesOnlyItsOwnBlock) {
  // On dp=2 x tp=2 q is column-split over tp: every piece of c_attn a rank is told to write is a
  // sub-box of its own block shifted into c_attn (q at column 0, k at H, v at 2H).
  ScratchDir scratch("keymap_own");
  const std::string mesh_text = "dp=2,tp=2";
  auto g = globals();
  comm::LocalWorld::run(4, [&](comm::Communicator& c) {
    CheckpointContent content;
    content.step = 1;
    TensorGroup group{"model", {}, qkv_map()};
    for (const auto& [name, value] : g) {
      reshard::Layout l = layout(mesh_text, name);
      group.tensors.push_back({name, value.shape(), DType::F32, l, block_of(value, l, c.rank())});
    }
    content.groups.push_back(group);
    SaveOptions options;
    options.split_bytes = 0;  // replicas (dp) split their blocks: still each within its own
    detail::SavePlan plan = detail::plan_save(c, scratch.path, content, options);
    int fused_pieces = 0;
    const KeyMap keys = qkv_map();
    for (const detail::Piece& p : plan.pieces) {
      const DistTensor& t = content.groups[p.group].tensors[p.tensor];
      if (keys.placements(t.name).empty()) continue;
      ++fused_pieces;
      reshard::Box own = reshard::block_at(t.global_shape, t.layout, coords_of(t.layout, p.writer));
      for (int d = 0; d < t.global_shape.ndim(); ++d) {
        const auto i = static_cast<size_t>(d);
        EXPECT_GE(p.box.offset[i], own.offset[i]) << t.name;  // the named tensor's coordinates
        EXPECT_LE(p.box.offset[i] + p.box.shape[d], own.offset[i] + own.shape[d]) << t.name;
      }
    }
    EXPECT_GE(fused_pieces, 12);  // 6 tensors x 2 tp blocks, each split over the 2 dp replicas or not
  });
}

TEST(KeyMap, BadTablesAndMissingPartsAreErrors) {
  KeyMap m;
  EXPECT_THROW(m.place("q", Shape{4, 4}, "c", Shape{4, 8}, {0, 6}), Error);  // leaves the stored tensor
  EXPECT_THROW(m.place("q", Shape{4, 4}, "c", Shape{4, 8}, {0}), Error);     // rank
  m.place("q", Shape{4, 4}, "c", Shape{4, 8}, {0, 0});
  EXPECT_THROW(m.place("q", Shape{4, 4}, "c", Shape{4, 8}, {0, 4}), Error);  // twice
  KeyMap hole = m;
  EXPECT_THROW(hole.check_tiling(), Error);  // half of c uncovered
  m.place("k", Shape{4, 4}, "c", Shape{4, 8}, {0, 2});
  try {
    m.check_tiling();
    FAIL() << "overlap accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("overlap"), std::string::npos) << e.what();
  }
  // Saving q without k and v would leave a hole in c_attn: refused before anything is written.
  ScratchDir scratch("keymap_bad");
  comm::LocalWorld::run(1, [&](comm::Communicator& c) {
    CheckpointContent content;
    content.step = 1;
    reshard::Layout l = layout("1", "q.weight");
    content.groups.push_back({"model", {{"q.weight", Shape{H, H}, DType::F32, l, make_global(DType::F32, Shape{H, H}, 1)}},
                              qkv_map()});
    try {
      save_checkpoint(c, scratch.path, content);
      FAIL() << "a hole was saved";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("hole"), std::string::npos) << e.what();
    }
  });
  EXPECT_FALSE(fs::exists(scratch.path / "checkpoint-1"));
  // Loading with a table whose fused shape disagrees with the file names both shapes.
  save_on("1", scratch.path, qkv_map(), 2);
  KeyMap wrong;
  wrong.place("q.weight", Shape{H, H}, "c_attn.weight", Shape{H, 4 * H}, {0, 0});
  comm::LocalWorld::run(1, [&](comm::Communicator& c) {
    LoadOptions o;
    o.keys = wrong;
    o.ignore_keys = {"*"};
    std::vector<LoadSpec> specs = {{"q.weight", Shape{H, H}, DType::F32, layout("1", "q.weight")}};
    try {
      load_group(scratch.path / "checkpoint-2", "model", specs, c.rank(), o);
      FAIL() << "a wrong fused shape loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("as 6x24"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("6x18"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace shardwise::ckpt
