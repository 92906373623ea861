// The resharder on device blocks (reshard/device_blocks.h, comm/device_buffers.h) on the fake
// device: for every pair of a set of distributions of a [5, 7, 3] tensor (shards on each dim, two
// mesh dims sharding one dim, partial sums and maxima: every step kind, all-reduce, reduce-scatter,
// all-gather, all-to-all, local slices, partialize and send / recv across meshes), every rank's
// block equals, bit for bit, the one the host path gives from the same inputs. Uneven shards (7 over
// 2 and 3 ranks) and empty ones (3 over 4) included. The fake device maps its memory PROT_NONE
// outside its copies, so a box moved through the host would die here.
#include <gtest/gtest.h>

#include <cstring>

#include "shardwise/comm/device_buffers.h"
#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"
#include "shardwise/reshard/executor.h"
#include "shardwise/tensor/current_stream.h"
#include "shardwise/tensor/device_copy.h"
#include "shardwise/tensor/fake_device.h"
#include "shardwise/verify/sim_mesh.h"
#include "tests/support/stream_races.h"

namespace shardwise::reshard {
namespace {

using mesh::DistAttr;
using mesh::Placement;
using mesh::ProcessMesh;

const Device kFake = Device::cuda(4);

DistAttr dist(std::vector<Placement> p) {
  DistAttr d(static_cast<int>(p.size()));
  for (size_t m = 0; m < p.size(); ++m) d.set(static_cast<int>(m), p[m]);
  return d;
}

std::vector<DistAttr> dists(int ndim) {
  const Placement R = Placement::replicate(), S0 = Placement::shard(0), S1 = Placement::shard(1),
                  S2 = Placement::shard(2), P = Placement::partial(mesh::ReduceOp::Sum),
                  M = Placement::partial(mesh::ReduceOp::Max);
  if (ndim == 1) return {dist({R}), dist({S0}), dist({S1}), dist({S2}), dist({P}), dist({M})};
  return {dist({R, R}), dist({S0, S1}), dist({S1, S0}), dist({S1, S1}), dist({S2, R}), dist({P, S1}), dist({S0, P}),
          dist({R, M})};
}

struct Meshes {
  ProcessMesh from, to;
  int world;
};

std::vector<int64_t> ids(std::initializer_list<int64_t> v) { return v; }

class DeviceReshard : public testing::TestWithParam<int> {
 protected:
  void SetUp() override { fake_ = &register_fake_device({.index = 4}); }
  void TearDown() override { expect_no_stream_races(*fake_); }
  FakeDeviceMemory* fake_ = nullptr;
};

TEST_P(DeviceReshard, EveryRanksBlockEqualsTheHostPathsBitForBit) {
  const std::vector<Meshes> all = {{ProcessMesh(Shape{2, 2}), ProcessMesh(Shape{2, 2}), 4},
                                   {ProcessMesh(Shape{3}), ProcessMesh(Shape{3}), 3},
                                   {ProcessMesh(Shape{2}, ids({0, 1})), ProcessMesh(Shape{2}, ids({2, 3})), 4},
                                   {ProcessMesh(Shape{2, 2}), ProcessMesh(Shape{4}), 4}};
  const Meshes& m = all[static_cast<size_t>(GetParam())];
  const Shape shape{5, 7, 3};
  Philox rng(7, stream_id("device reshard"));
  const Tensor global = verify::random_tensor(shape, DType::F32, {}, rng);
  const std::vector<DistAttr> src = dists(m.from.ndim()), dst = dists(m.to.ndim());
  int checked = 0;
  for (const DistAttr& a : src) {
    const std::vector<Tensor> blocks = verify::distribute(global, a, m.from, Philox(3, stream_id(a.to_string())));
    for (const DistAttr& b : dst) {
      const Plan plan = plan_reshard(shape, DType::F32, {m.from, a}, {m.to, b});
      std::vector<Tensor> host(static_cast<size_t>(m.world)), device(static_cast<size_t>(m.world));
      comm::LocalWorld::run(m.world, [&](comm::Communicator& c) {
        const int64_t me = c.rank();
        const Tensor in = m.from.contains(me) ? blocks[static_cast<size_t>(m.from.rank_index_of_process(me))] : Tensor();
        Resharder on_host(c.group(c.members())), on_device(c.group(c.members()));
        host[static_cast<size_t>(me)] = on_host.run(plan, in);
        const Stream stream = device_memory(kFake).create_stream();
        StreamScope current(stream);
        comm::DeviceBuffers scope(kFake, stream);
        const Tensor out = on_device.run(plan, in.defined() ? to_device(in, kFake, stream) : Tensor());
        EXPECT_EQ(on_device.bytes_sent(), on_host.bytes_sent());
        if (out.defined()) {
          EXPECT_TRUE(out.on_device());
          device[static_cast<size_t>(me)] = to_host(out, stream);
        }
        device_memory(kFake).destroy_stream(stream);
      });
      for (int r = 0; r < m.world; ++r) {
        const Tensor &h = host[static_cast<size_t>(r)], &d = device[static_cast<size_t>(r)];
        ASSERT_EQ(h.defined(), d.defined()) << a.to_string() << " -> " << b.to_string() << " rank " << r;
        if (!h.defined()) continue;
        ASSERT_EQ(h.shape(), d.shape());
        EXPECT_EQ(std::memcmp(h.raw(), d.raw(), h.nbytes()), 0)
            << a.to_string() << " -> " << b.to_string() << " rank " << r << "\n" << plan.to_string();
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, static_cast<int>(src.size() * dst.size()));
}

INSTANTIATE_TEST_SUITE_P(Meshes, DeviceReshard, testing::Values(0, 1, 2, 3));

// A block on a device without a scope saying so is a clear error, not a host read.
class DeviceReshardErrors : public testing::Test {
 protected:
  void SetUp() override { fake_ = &register_fake_device({.index = 4}); }
  void TearDown() override { expect_no_stream_races(*fake_); }
  FakeDeviceMemory* fake_ = nullptr;
};

TEST_F(DeviceReshardErrors, ADeviceBlockWithoutItsScopeIsAnError) {
  comm::LocalWorld::run(1, [&](comm::Communicator& c) {
    Resharder r(c.group(c.members()));
    const Plan plan = plan_reshard(Shape{4}, DType::F32, {ProcessMesh(Shape{1}), dist({Placement::replicate()})},
                                   {ProcessMesh(Shape{1}), dist({Placement::shard(0)})});
    try {
      (void)r.run(plan, zeros_on(DType::F32, Shape{4}, kFake));
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("a block on cuda:4 to a reshard of blocks on host"), std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
}  // namespace shardwise::reshard
