// The rules around saving and loading: bad input refused before anything is written, keys matched
// strictly, dtype conversion explicit, rotation by step, resume picks the newest verified
// checkpoint, async saves raise writer errors at the next save.
#include <gtest/gtest.h>

#include "ckpt_test_util.h"
#include "shardwise/ckpt/async_saver.h"
#include "shardwise/ckpt/commit.h"
#include "shardwise/ckpt/manifest.h"
#include "shardwise/ckpt/save_plan.h"
#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"

namespace shardwise::ckpt {
namespace {

using namespace testing;

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void save1(const fs::path& root, int64_t step, SaveOptions options = {}) {
  comm::LocalWorld::run(1, [&](comm::Communicator& c) {
    save_checkpoint(c, root, content_for(small_model(), topologies()[0], 0, step), options);
  });
}

std::vector<LoadSpec> specs_of(const std::string& group) {
  std::vector<LoadSpec> specs;
  for (const auto& t : small_model()) {
    if (t.group == group) specs.push_back({t.name, t.value.shape(), t.value.dtype(), layout_of(topologies()[0], t.name)});
  }
  return specs;
}

TEST(CheckpointSave, RefusesPartialAndMismatchedRanksBeforeWriting) {
  ScratchDir scratch("bad");
  auto model = small_model();
  std::string msg = error_of([&] {
    comm::LocalWorld::run(2, [&](comm::Communicator& c) {
      CheckpointContent content = content_for(model, topologies()[1], c.rank(), 5);
      content.groups[0].tensors[1].layout.dist = mesh::parse_dist("P(sum)", 1);
      save_checkpoint(c, scratch.path, content);
    });
  });
  EXPECT_NE(msg.find("tensor 'fc1.weight' of group 'model'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Partial"), std::string::npos) << msg;
  msg = error_of([&] {
    comm::LocalWorld::run(2, [&](comm::Communicator& c) {
      CheckpointContent content = content_for(model, topologies()[1], c.rank(), 5);
      if (c.rank() == 1) content.groups[0].tensors.pop_back();
      save_checkpoint(c, scratch.path, content);
    });
  });
  EXPECT_NE(msg.find("rank 1 describes the checkpoint differently"), std::string::npos) << msg;
  msg = error_of([&] {
    comm::LocalWorld::run(2, [&](comm::Communicator& c) {
      CheckpointContent content = content_for(model, topologies()[2], c.rank(), 5);
      if (c.rank() == 1) content.groups[0].tensors[1].local = Tensor(DType::F32, Shape{4, 7});
      save_checkpoint(c, scratch.path, content);
    });
  });
  EXPECT_NE(msg.find("rank 1 holds a block of shape 4x7"), std::string::npos) << msg;
  EXPECT_TRUE(fs::is_empty(scratch.path));  // nothing written, not even a .tmp directory
}

TEST(CheckpointSave, NeverOverwritesASavedCheckpoint) {
  ScratchDir scratch("over");
  save1(scratch.path, 4);
  std::string before = read_text_file(scratch.path / "checkpoint-4" / "manifest.json");
  std::string msg = error_of([&] { save1(scratch.path, 4); });
  EXPECT_NE(msg.find("already exists"), std::string::npos) << msg;
  EXPECT_EQ(read_text_file(scratch.path / "checkpoint-4" / "manifest.json"), before);
  EXPECT_TRUE(verify_checkpoint(scratch.path / "checkpoint-4").ok());
}

TEST(CheckpointSave, WritersAreBalancedByBytesAndEveryRankWrites) {
  auto model = small_model();
  SaveOptions options;
  options.split_bytes = 0;
  // tp4 shards unevenly (fixed writers); on "rep4" every tensor is replicated on 4 ranks, so
  // least-loaded assignment keeps every rank within one piece of the busiest.
  for (const Topology& topo : {topologies()[4], Topology{"rep4", "4", {{"*", "R"}}}}) {
    ScratchDir scratch("bal");
    comm::LocalWorld::run(4, [&](comm::Communicator& c) {
      CheckpointContent content = content_for(model, topo, c.rank(), 1);
      detail::SavePlan plan = detail::plan_save(c, scratch.path, content, options);
      std::vector<uint64_t> bytes(4, 0);
      uint64_t largest = 0, total = 0;
      for (const auto& p : plan.pieces) {
        bytes[static_cast<size_t>(p.writer)] += p.bytes;
        largest = std::max(largest, p.bytes);
        total += p.bytes;
      }
      uint64_t sum = 0;
      for (const auto& t : model) sum += t.value.nbytes();
      EXPECT_EQ(total, sum) << topo.label;  // each byte written exactly once
      for (uint64_t b : bytes) {
        EXPECT_GT(b, 0u) << topo.label;
        if (topo.label == "rep4") {
          EXPECT_LE(*std::max_element(bytes.begin(), bytes.end()) - b, largest);
        }
      }
      detail::execute_save(c, plan, detail::sources_in(plan, content, c.rank()));
    });
    EXPECT_TRUE(verify_checkpoint(scratch.path / "checkpoint-1").ok()) << topo.label;
  }
}

TEST(CheckpointLoad, StrictKeysIgnorePatternsExplicitDtypeConversion) {
  ScratchDir scratch("load");
  save1(scratch.path, 1);
  fs::path dir = scratch.path / "checkpoint-1";
  auto specs = specs_of("model");
  specs.erase(specs.begin());  // embed.weight not asked for
  specs.push_back({"extra.weight", Shape{2}, DType::F32, layout_of(topologies()[0], "x")});
  std::string msg = error_of([&] { load_group(dir, "model", specs, 0); });
  EXPECT_NE(msg.find("missing from the checkpoint (1): 'extra.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not asked for (1): 'embed.weight'"), std::string::npos) << msg;
  LoadOptions relaxed;
  relaxed.ignore_keys = {"extra.*", "embed*"};
  auto loaded = load_group(dir, "model", specs, 0, relaxed);
  EXPECT_EQ(loaded.count("extra.weight"), 0u);
  EXPECT_EQ(loaded.at("empty").shape(), (Shape{0, 4}));  // zero-size tensors load

  specs = specs_of("model");
  specs[1].dtype = DType::F64;  // fc1.weight is F32 in the checkpoint
  msg = error_of([&] { load_group(dir, "model", specs, 0); });
  EXPECT_NE(msg.find("tensor 'fc1.weight' is f32 in the checkpoint, asked for f64"), std::string::npos) << msg;
  LoadOptions convert;
  convert.convert_dtype = true;
  loaded = load_group(dir, "model", specs, 0, convert);
  EXPECT_EQ(loaded.at("fc1.weight").dtype(), DType::F64);
  EXPECT_EQ(loaded.at("fc1.weight").at(3), small_model()[1].value.at(3));
  specs[1].global_shape = Shape{10, 8};
  msg = error_of([&] { load_group(dir, "model", specs, 0, convert); });
  EXPECT_NE(msg.find("has shape 10x7 in the checkpoint"), std::string::npos) << msg;
}

TEST(CheckpointCommit, RotationByStepKeepsNewerUnverifiedAndResumePicksNewestVerified) {
  ScratchDir scratch("rot");
  // A newer directory that is not a complete checkpoint (no manifest): never counted or deleted.
  fs::create_directories(scratch.path / "checkpoint-99");
  fs::create_directories(scratch.path / "checkpoint-7.tmp");
  SaveOptions options;
  options.save_total_limit = 2;
  for (int64_t step : {10, 2, 30, 20}) save1(scratch.path, step, options);  // saved out of step order
  std::vector<int64_t> steps;
  for (const auto& c : list_checkpoints(scratch.path)) steps.push_back(c.step);
  // After saving 20, the two newest by step not above 20 are kept (10, 20); 30 is newer: kept.
  EXPECT_EQ(steps, (std::vector<int64_t>{10, 20, 30, 99}));
  std::vector<std::string> rejected;
  auto found = find_resume(scratch.path, true, &rejected);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->step, 30);
  ASSERT_EQ(rejected.size(), 1u);
  EXPECT_NE(rejected[0].find("checkpoint-99: manifest.json: missing"), std::string::npos) << rejected[0];
  EXPECT_FALSE(fs::exists(scratch.path / "checkpoint-7.tmp"));
  // A corrupted newest checkpoint is skipped by checksum.
  fs::path victim = scratch.path / "checkpoint-30" / "config.json";
  std::string text = read_text_file(victim);
  text[2] = text[2] == 'x' ? 'y' : 'x';
  write_file_atomic(victim, text);
  found = find_resume(scratch.path);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->step, 20);
  comm::LocalWorld::run(2, [&](comm::Communicator& c) {
    auto r = resume(c, scratch.path);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->step, 20);
  });
}

// Needs root and a mount namespace that allows tmpfs (skipped otherwise): a file system of one page
// fills up in the middle of the save.
TEST(CheckpointSave, DiskFullRemovesTheHalfWrittenTmpAtOnce) {
  ScratchDir scratch("diskfull");
  fs::create_directories(scratch.path);
  std::string mount = "mount -t tmpfs -o size=4k tmpfs " + scratch.path.string() + " 2>/dev/null";
  if (std::system(mount.c_str()) != 0) GTEST_SKIP() << "cannot mount a small tmpfs here";
  std::string msg = error_of([&] { save1(scratch.path, 5); });
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(scratch.path)) left.push_back(e.path().filename().string());
  std::system(("umount " + scratch.path.string()).c_str());
  EXPECT_NE(msg.find("save checkpoint-5 into '" + scratch.path.string() + "' failed, nothing was committed"),
            std::string::npos) << msg;
  EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
  EXPECT_TRUE(left.empty()) << left.front();
}

TEST(AsyncSaver, SavesWhatTheCallerHadAndRaisesWriterErrorsAtTheNextSave) {
  ScratchDir scratch("async");
  auto model = small_model();
  comm::LocalWorld::run(2, [&](comm::Communicator& c) {
    AsyncSaver saver;
    CheckpointContent content = content_for(model, topologies()[2], c.rank(), 1);
    saver.save(c, scratch.path, content);
    // The caller may change its tensors at once: the save holds host copies.
    for (auto& g : content.groups) {
      for (auto& t : g.tensors) {
        if (t.local.nbytes()) std::memset(t.local.raw(), 0x5a, t.local.nbytes());
      }
    }
    c.barrier();  // collectives from the caller while the writer runs
    EXPECT_EQ(saver.finish(), scratch.path / "checkpoint-1");
    size_t staged = saver.staging_bytes();
    saver.save(c, scratch.path, content_for(model, topologies()[2], c.rank(), 2));
    saver.finish();
    EXPECT_EQ(saver.staging_bytes(), staged);  // buffers reused
  });
  for (const auto& t : model) {
    auto loaded = load_group(scratch.path / "checkpoint-1", t.group,
                             std::vector<LoadSpec>{{t.name, t.value.shape(), t.value.dtype(), layout_of(topologies()[0], t.name)}},
                             0, LoadOptions{{"*"}, false, {}});
    EXPECT_TRUE(bit_equal(loaded.at(t.name), t.value)) << t.name;
  }
  // A failure in the background writer (injected at its 3rd durable step) surfaces at the next save.
  std::string msg = error_of([&] {
    comm::LocalWorld::run(2, [&](comm::Communicator& c) {
      AsyncSaver saver;
      if (c.rank() == 0) arm_crash_point(3, CrashAction::Throw);
      c.barrier();
      saver.save(c, scratch.path, content_for(model, topologies()[2], c.rank(), 3));
      try {
        saver.save(c, scratch.path, content_for(model, topologies()[2], c.rank(), 4));
      } catch (...) {
        arm_crash_point(0);
        throw;
      }
    });
  });
  arm_crash_point(0);
  EXPECT_NE(msg.find("injected failure at crash point 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nothing was committed"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(scratch.path / "checkpoint-3"));
  EXPECT_EQ(find_resume(scratch.path)->step, 2);
}

}  // namespace
}  // namespace shardwise::ckpt
