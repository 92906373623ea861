// Save on one topology, load on every other: every block bit-exact. Whole tensors in the files
// are checked against the global values directly (no layout math on the reading side).
#include <gtest/gtest.h>

#include "ckpt_test_util.h"
#include "shardwise/ckpt/commit.h"
#include "shardwise/ckpt/group_reader.h"
#include "shardwise/ckpt/manifest.h"
#include "shardwise/ckpt/save_plan.h"
#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"

namespace shardwise::ckpt {
namespace {

using namespace testing;

void save_on(const Topology& topo, const std::vector<GlobalTensor>& model, const fs::path& root, int64_t step,
             SaveOptions options = {}) {
  int n = static_cast<int>(mesh::parse_mesh(topo.mesh).size());
  comm::LocalWorld::run(n, [&](comm::Communicator& c) {
    fs::path dir = save_checkpoint(c, root, content_for(model, topo, c.rank(), step), options);
    EXPECT_EQ(dir, root / checkpoint_dir_name(step));
  });
}

TEST(CheckpointRoundTrip, EveryTopologyLoadsIntoEveryOtherBitExact) {
  auto model = small_model();
  for (const Topology& from : topologies()) {
    ScratchDir scratch("rt");
    SaveOptions options;
    options.max_shard_bytes = 300;  // several shards per group
    options.split_bytes = 0;        // replicas split every block among themselves
    save_on(from, model, scratch.path, 3, options);
    fs::path dir = scratch.path / "checkpoint-3";
    VerifyReport report = verify_checkpoint(dir);
    ASSERT_TRUE(report.ok()) << from.label << ": " << report.problems.front();
    // Whole tensors, read without any layout, equal the global values bit for bit.
    for (const auto& t : model) {
      GroupReader g(dir, t.group);
      EXPECT_TRUE(bit_equal(g.file_of(t.name).read(t.name), t.value)) << from.label << " " << t.name;
    }
    EXPECT_EQ(load_json(dir, "config.json")["hidden_size"], 7);
    for (const Topology& to : topologies()) {
      int n = static_cast<int>(mesh::parse_mesh(to.mesh).size());
      comm::LocalWorld::run(n, [&](comm::Communicator& c) {
        for (const char* group : {"model", "optimizer", "master_weights"}) {
          std::vector<LoadSpec> specs;
          for (const auto& t : model) {
            if (t.group == group) specs.push_back({t.name, t.value.shape(), t.value.dtype(), layout_of(to, t.name)});
          }
          auto loaded = load_group(dir, group, specs, c.rank());
          for (const auto& t : model) {
            if (t.group != group) continue;
            EXPECT_TRUE(bit_equal(loaded.at(t.name), block_of(t.value, layout_of(to, t.name), c.rank())))
                << from.label << " -> " << to.label << " rank " << c.rank() << " " << t.name;
          }
        }
      });
    }
  }
}

TEST(CheckpointSave, WritesHuggingFaceShardsAndIndex) {
  auto model = small_model();
  ScratchDir scratch("hf");
  SaveOptions options;
  options.max_shard_bytes = 300;
  save_on(topologies()[3], model, scratch.path, 7, options);
  fs::path dir = scratch.path / "checkpoint-7";
  auto index = load_json(dir, "model.safetensors.index.json");
  uint64_t total = 0;
  for (const auto& t : model) {
    if (t.group == "model") total += t.value.nbytes();
  }
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
  // In the given order, a new file when the next tensor would pass 300 bytes: [embed 156],
  // [fc1.weight 280], [fc1.bias 40], [fc2.weight 280, norm 14, mask 5], [positions 36, empty 0].
  const char* expect[][2] = {{"embed.weight", "1"}, {"fc1.weight", "2"}, {"fc1.bias", "3"}, {"fc2.weight", "4"},
                             {"norm.weight", "4"}, {"mask", "4"}, {"positions", "5"}, {"empty", "5"}};
  for (auto& [name, k] : expect) {
    EXPECT_EQ(index["weight_map"][name], fmt::format("model-0000{}-of-00005.safetensors", k)) << name;
  }
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    SafetensorsFile f(e.path());
    ASSERT_NE(f.header().metadata_value("format"), nullptr) << e.path();
    EXPECT_EQ(*f.header().metadata_value("format"), "pt");  // what transformers' loader checks
  }
  auto manifest = load_json(dir, "manifest.json");
  EXPECT_EQ(manifest["step"], 7);
  EXPECT_EQ(manifest["saved_on"]["world_size"], 4);
  EXPECT_EQ(manifest["files"].size(), 5u + 3u + 1u + 3u + 2u);  // 5+3+1 shards, 3 indexes, 2 JSON files
  EXPECT_EQ(read_text_file(scratch.path / "latest"), "checkpoint-7\n");
}

// A single-file group (PEFT's adapter_model.safetensors): one "<group>.safetensors" whatever
// max_shard_bytes says, no index; the manifest names the file as the group; it verifies and loads
// on every topology like an indexed group.
TEST(CheckpointSave, ASingleFileGroupIsOneFileWithoutAnIndex) {
  auto model = small_model();
  ScratchDir scratch("single");
  SaveOptions options;
  options.max_shard_bytes = 100;  // would cut the model group into many shards
  comm::LocalWorld::run(4, [&](comm::Communicator& c) {
    CheckpointContent content = content_for(model, topologies()[3], c.rank(), 2);
    for (TensorGroup& g : content.groups) g.single_file = g.name == "model";
    save_checkpoint(c, scratch.path, content, options);
  });
  fs::path dir = scratch.path / "checkpoint-2";
  EXPECT_TRUE(fs::exists(dir / "model.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir / "model-00001-of-00001.safetensors"));
  EXPECT_TRUE(fs::exists(dir / "optimizer.safetensors.index.json"));
  EXPECT_EQ(load_json(dir, "manifest.json")["groups"]["model"], "model.safetensors");
  VerifyReport report = verify_checkpoint(dir);
  ASSERT_TRUE(report.ok()) << report.problems.front();
  EXPECT_TRUE(report.notes.empty()) << report.notes.front();
  SafetensorsFile file(dir / "model.safetensors");
  EXPECT_EQ(*file.header().metadata_value("format"), "pt");
  for (const auto& t : model) {
    if (t.group == "model") { EXPECT_TRUE(bit_equal(file.read(t.name), t.value)) << t.name; }
  }
  comm::LocalWorld::run(2, [&](comm::Communicator& c) {
    const Topology to = topologies()[2];
    std::vector<LoadSpec> specs;
    for (const auto& t : model) {
      if (t.group == "model") specs.push_back({t.name, t.value.shape(), t.value.dtype(), layout_of(to, t.name)});
    }
    auto loaded = load_group(dir, "model", specs, c.rank());
    for (const auto& t : model) {
      if (t.group == "model") { EXPECT_TRUE(bit_equal(loaded.at(t.name), block_of(t.value, layout_of(to, t.name), c.rank()))); }
    }
  });
}

}  // namespace
}  // namespace shardwise::ckpt
