// Checkpoints of tensors in device memory, on the fake device (tensor/fake_device.h: no GPU, its
// memory PROT_NONE outside its copies, so a host read of a device block would die): a save from the
// device writes the same files as the save of the same tensors from the host, byte for byte, with
// one counted device-to-host copy per block; a checkpoint saved from the host loads into device
// tensors that copy back bit for bit; an asynchronous save makes its copies before it returns and
// writes them, whatever the device tensors become after.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "ckpt_test_util.h"
#include "shardwise/ckpt/async_saver.h"
#include "shardwise/ckpt/device_staging.h"
#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"
#include "shardwise/tensor/device_copy.h"
#include "shardwise/tensor/fake_device.h"

namespace shardwise::ckpt {
namespace {

using namespace testing;

const Device kDev = Device::cuda(5);

class DeviceCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override { register_fake_device({.index = 5}); }
};

CheckpointContent on_device(CheckpointContent c) {
  for (TensorGroup& g : c.groups) {
    for (DistTensor& t : g.tensors) {
      if (t.local.defined()) t.local = to_device(t.local, kDev);
    }
  }
  return c;
}

int world_of(const Topology& topo) { return static_cast<int>(mesh::parse_mesh(topo.mesh).size()); }

// Checkpoint directories `a` and `b` hold the same files, each byte for byte the same.
void expect_same_files(const fs::path& a, const fs::path& b) {
  std::vector<std::string> names_a, names_b;
  for (const auto& e : fs::directory_iterator(a)) names_a.push_back(e.path().filename().string());
  for (const auto& e : fs::directory_iterator(b)) names_b.push_back(e.path().filename().string());
  std::sort(names_a.begin(), names_a.end());
  std::sort(names_b.begin(), names_b.end());
  ASSERT_EQ(names_a, names_b);
  for (const std::string& n : names_a) EXPECT_EQ(read_text_file(a / n), read_text_file(b / n)) << n;
}

// The tensors of small_model() with at least one element: a block each on one rank.
int64_t nonempty_tensors(const std::vector<GlobalTensor>& model, int64_t* bytes) {
  int64_t n = 0;
  *bytes = 0;
  for (const auto& t : model) {
    if (t.value.numel() > 0) n += 1, *bytes += static_cast<int64_t>(t.value.nbytes());
  }
  return n;
}

TEST_F(DeviceCheckpoint, ASaveFromTheDeviceWritesTheHostSavesFilesWithOneCopyPerBlock) {
  const auto model = small_model();
  for (const Topology& topo : {topologies()[0], topologies()[2], topologies()[3]}) {
    ScratchDir host("dev_host"), dev("dev_dev");
    comm::LocalWorld::run(world_of(topo), [&](comm::Communicator& c) {
      save_checkpoint(c, host.path, content_for(model, topo, c.rank(), 1));
    });
    std::vector<CheckpointContent> contents;
    for (int r = 0; r < world_of(topo); ++r) contents.push_back(on_device(content_for(model, topo, r, 1)));
    reset_device_copy_stats();
    comm::LocalWorld::run(world_of(topo), [&](comm::Communicator& c) { save_checkpoint(c, dev.path, contents[c.rank()]); });
    expect_same_files(host.path / "checkpoint-1", dev.path / "checkpoint-1");
    if (world_of(topo) == 1) {  // one rank writes every block: one copy each, nothing more
      int64_t bytes = 0;
      EXPECT_EQ(device_copy_stats().to_host_copies, nonempty_tensors(model, &bytes)) << topo.label;
      EXPECT_EQ(device_copy_stats().to_host_bytes, bytes) << topo.label;
      EXPECT_EQ(device_copy_stats().to_device_copies, 0) << topo.label;
    }
  }
}

TEST_F(DeviceCheckpoint, AHostCheckpointLoadsIntoDeviceTensorsThatCopyBackBitForBit) {
  const auto model = small_model();
  ScratchDir scratch("dev_load");
  comm::LocalWorld::run(1, [&](comm::Communicator& c) {
    save_checkpoint(c, scratch.path, content_for(model, topologies()[0], 0, 1));
  });
  for (const Topology& topo : {topologies()[0], topologies()[3]}) {  // whole tensors; dp x tp blocks
    for (int64_t process = 0; process < world_of(topo); ++process) {
      int64_t loaded = 0;
      reset_device_copy_stats();
      for (const std::string group : {"model", "optimizer", "master_weights"}) {
        std::vector<LoadSpec> specs;
        for (const auto& t : model) {
          if (t.group == group) specs.push_back({t.name, t.value.shape(), t.value.dtype(), layout_of(topo, t.name)});
        }
        LoadOptions options;
        options.device = kDev;
        for (const auto& [name, block] : load_group(scratch.path / "checkpoint-1", group, specs, process, options)) {
          const GlobalTensor& t = *std::find_if(model.begin(), model.end(),
                                                [&](const GlobalTensor& g) { return g.group == group && g.name == name; });
          ASSERT_TRUE(block.on_device()) << name;
          EXPECT_EQ(block.device(), kDev) << name;
          EXPECT_TRUE(bit_equal(to_host(block), block_of(t.value, layout_of(topo, name), process))) << topo.label << " " << name;
          loaded += 1;
        }
      }
      EXPECT_EQ(device_copy_stats().to_device_copies, loaded) << topo.label;  // one copy per block
    }
  }
}

TEST_F(DeviceCheckpoint, LoadingOntoADeviceWithoutMemoryNamesIt) {
  ScratchDir scratch("dev_none");
  comm::LocalWorld::run(1, [&](comm::Communicator& c) {
    save_checkpoint(c, scratch.path, content_for(small_model(), topologies()[0], 0, 1));
  });
  LoadOptions options;
  options.device = Device::cuda(61);
  options.ignore_keys = {"*"};
  const std::vector<LoadSpec> specs = {{"fc1.bias", Shape{10}, DType::F32, layout_of(topologies()[0], "fc1.bias")}};
  try {
    load_group(scratch.path / "checkpoint-1", "model", specs, 0, options);
    FAIL() << "loaded onto cuda:61, which has no memory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no device memory for cuda:61"), std::string::npos) << e.what();
  }
}

TEST_F(DeviceCheckpoint, AnAsyncSaveCopiesBeforeItReturnsAndWritesThoseCopies) {
  const auto model = small_model();
  ScratchDir host("dev_async_host"), dev("dev_async");
  comm::LocalWorld::run(1, [&](comm::Communicator& c) {
    save_checkpoint(c, host.path, content_for(model, topologies()[0], 0, 1));
  });
  comm::LocalWorld::run(1, [&](comm::Communicator& c) {
    CheckpointContent content = on_device(content_for(model, topologies()[0], 0, 1));
    AsyncSaver saver;
    reset_device_copy_stats();
    arm_crash_point(1, CrashAction::Hold);  // the writer stops after its first file until released
    saver.save(c, dev.path, content);
    int64_t bytes = 0;
    EXPECT_EQ(device_copy_stats().to_host_copies, nonempty_tensors(model, &bytes));  // all made before returning
    EXPECT_FALSE(fs::exists(dev.path / "checkpoint-1"));                              // nothing committed yet
    while (crash_points_passed() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    // The writer is mid-way: the caller overwrites every device tensor (training goes on).
    for (TensorGroup& g : content.groups) {
      for (DistTensor& t : g.tensors) {
        std::vector<std::byte> junk(t.local.nbytes(), std::byte{0x5a});
        if (!junk.empty()) copy_from_host(junk, t.local);
      }
    }
    arm_crash_point(0);  // releases the writer
    EXPECT_EQ(saver.finish(), dev.path / "checkpoint-1");
    EXPECT_EQ(device_copy_stats().to_host_copies, nonempty_tensors(model, &bytes));  // no copy after returning
  });
  expect_same_files(host.path / "checkpoint-1", dev.path / "checkpoint-1");
}

}  // namespace
}  // namespace shardwise::ckpt
