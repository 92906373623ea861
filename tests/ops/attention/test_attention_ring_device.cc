// Ring attention on the fake device (ring.h's ring on device tensors, the fake table's
// ring_attention kernels: ops/fake_device_kernels.h). On rings of 2 and 3 thread ranks the op's
// device kernels give every rank the host ring's out, lse, dq, dk and dv bit for bit (f32 and bf16,
// uneven blocks, packed documents, cp's balanced order), and the blocks travel as device buffers:
// each rank's world is a RoutedComm of two threads-backend groups, and every send and receive
// reaches its device side (made under a DeviceBuffers scope), the host side only the ring's gather
// of the blocks' offsets (one a call). The fake table's fallback (the host ring on host views of
// device memory) sent them all as host buffers.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "shardwise/comm/local.h"
#include "shardwise/comm/routed.h"
#include "shardwise/mesh/dist_attr.h"
#include "shardwise/mesh/shard_math.h"
#include "shardwise/ops/attention/ring.h"
#include "shardwise/ops/op.h"
#include "shardwise/tensor/device_copy.h"
#include "tests/ops/attention/attention_inputs.h"
#include "tests/support/on_fake_device.h"

namespace shardwise::ops {
namespace {

using namespace testing_attention;  // NOLINT: the shared inputs

struct Case {
  int ranks;
  int64_t T;
  bool docs;
  int64_t balanced;
  DType dtype;
};

void expect_same_bits(const Tensor& device, const Tensor& host, const std::string& what) {
  const Tensor d = to_host(device);
  ASSERT_EQ(d.dtype(), host.dtype()) << what;
  ASSERT_EQ(d.shape(), host.shape()) << what;
  EXPECT_EQ(std::memcmp(d.raw(), host.raw(), host.nbytes()), 0) << what << ": not the host ring's bits";
}

class RingOnFakeDevice : public OnFakeDevice {};

TEST_F(RingOnFakeDevice, TheDeviceRingGivesTheHostRingsBitsWithItsBlocksAsDeviceBuffers) {
  for (const Case& c : {Case{2, 70, false, 1, DType::F32}, Case{3, 70, true, 1, DType::F32},
                        Case{2, 24, false, 2, DType::BF16}, Case{3, 36, true, 3, DType::F32}}) {
    const int64_t B = 2, H = 2, D = 4;
    const Shape qs{B, H, c.T, D};
    const Tensor q = random_f64(qs, 21).to(c.dtype), k = random_f64(qs, 22).to(c.dtype),
                 v = random_f64(qs, 23).to(c.dtype), w = random_f64(qs, 24).to(c.dtype);
    const Tensor doc = c.docs ? documents(B, c.T) : Tensor();
    Attrs attrs{{"scale", 0.5}};
    if (c.balanced > 1) attrs.set("balanced_ranks", c.balanced);
    const OpDef& op = *op_registry().find(c.docs ? "ring_attention_docs" : "ring_attention");
    const std::string what = "ring of " + std::to_string(c.ranks) + " T " + std::to_string(c.T) + " " +
                             std::string(dtype_name(c.dtype)) + (c.docs ? " docs" : "") + " balanced " + std::to_string(c.balanced);
    const mesh::ProcessMesh mesh(Shape{c.ranks});
    comm::LocalWorld::run(c.ranks, [&](comm::Communicator& world) {
      auto routed = std::make_shared<comm::RoutedComm>(world.group(world.members()), world.group(world.members()));
      comm::MeshComm mesh_comm(mesh, routed);
      const mesh::Range r = mesh::chunk_range(c.T, c.ranks, world.rank());
      const mesh::DistAttr seq = mesh::parse_dist("S(2)", 1);
      KernelContext ctx;
      ctx.mesh_comm = &mesh_comm;
      std::vector<Tensor> host{rows(q, 2, r.offset, r.size), rows(k, 2, r.offset, r.size), rows(v, 2, r.offset, r.size)};
      if (c.docs) host.push_back(doc);
      for (size_t i = 0; i < 3; ++i) ctx.tensors.push_back({qs, {0, 0, r.offset, 0}, seq});
      if (c.docs) ctx.tensors.push_back({doc.shape(), {}, mesh::DistAttr(1)});
      std::vector<Tensor> dev;
      for (const Tensor& t : host) dev.push_back(to_device(t, kFake));
      const std::string mine = what + " rank " + std::to_string(world.rank());

      const std::vector<Tensor> want = run_forward(op, host, attrs, &ctx);
      const int64_t host_calls = routed->routes().host.load();  // the gather and k, v sent and received a step
      ASSERT_EQ(host_calls, 1 + 4 * (c.ranks - 1)) << mine << ": the host ring passes host buffers";
      ASSERT_EQ(routed->routes().device.load(), 0) << mine;
      const std::vector<Tensor> got = run_forward(op, dev, attrs, &ctx);
      EXPECT_EQ(routed->routes().host.load(), host_calls + 1) << mine << ": the device ring's host call: the gather";
      EXPECT_EQ(routed->routes().device.load(), 4 * (c.ranks - 1)) << mine << ": k and v sent and received a step";
      for (size_t o = 0; o < 2; ++o) expect_same_bits(got[o], want[o], mine + (o == 0 ? " out" : " lse"));

      const Tensor dout = rows(w, 2, r.offset, r.size);
      KernelContext bctx = ctx;  // inputs ++ outputs ++ output grads
      for (int i = 0; i < 3; ++i) bctx.tensors.push_back(ctx.tensors[0]);
      const std::vector<Tensor> hout{want[0], want[1]}, hdout{dout, Tensor()};
      const std::vector<Tensor> dout_dev{to_device(dout, kFake), Tensor()};
      const std::vector<Tensor> gw = run_backward(op, host, hout, hdout, attrs, &bctx);
      const int64_t device_before = routed->routes().device.load(), host_before = routed->routes().host.load();
      const std::vector<Tensor> gg = run_backward(op, dev, got, dout_dev, attrs, &bctx);
      EXPECT_EQ(routed->routes().host.load() - host_before, 1) << mine << ": the backward's gather";
      // k, v for n - 1 steps and dk, dv for n: a send and a receive each.
      EXPECT_EQ(routed->routes().device.load() - device_before, 4 * (c.ranks - 1) + 4 * c.ranks) << mine;
      for (size_t g = 0; g < 3; ++g) expect_same_bits(gg[g], gw[g], mine + std::string(" d") + "qkv"[g]);
    });
  }
}

}  // namespace
}  // namespace shardwise::ops
