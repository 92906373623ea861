// The verifier with the ranks' kernels on a device (VerifyOptions::device): on the fake device
// (tensor/fake_device.h: guarded memory; its table runs each op's CPU kernel) every op gives the
// CPU run's checks with no failure, so any difference would be plumbing; a wrong device kernel is
// caught naming the op; a kernel the device refuses is a skip with its reason, never a pass; the
// inputs go to the device and the outputs come back as counted copies.
#include <gtest/gtest.h>

#include <algorithm>

#include "shardwise/tensor/device_copy.h"
#include "shardwise/verify/verifier.h"
#include "tests/support/on_fake_device.h"

namespace shardwise::verify {
namespace {

using ops::DeviceKernelTable;
using ops::KernelContext;
using ops::OpDef;
using In = std::span<const Tensor>;

class DeviceVerify : public OnFakeDevice {
 protected:

  // The fake table's kernels for every op (`fallback`), with `edit` adding or replacing entries.
  static std::shared_ptr<DeviceKernelTable> fake_table_with(bool fallback,
                                                            const std::function<void(DeviceKernelTable&)>& edit) {
    const auto fake = ops::fake_device_kernels();
    auto table = std::make_shared<DeviceKernelTable>("test");
    if (fallback) table->set_fallback(*fake->forward(""), *fake->backward(""));
    edit(*table);
    return table;
  }

  static VerifyOptions on(Device device, std::vector<mesh::ProcessMesh> meshes = {mesh::ProcessMesh(Shape{2})}) {
    VerifyOptions o;
    o.device = device;
    o.meshes = std::move(meshes);
    return o;
  }
};

// The fake device's forward kernel of `as` run for the op asked for: a deliberately wrong kernel.
ops::DeviceForwardFn runs_as(const std::string& as) {
  return [as](const OpDef&, In in, const Attrs& attrs, const KernelContext* ctx) {
    return (*ops::fake_device_kernels()->forward(as))(ops::op_registry().get(as), in, attrs, ctx);
  };
}

TEST_F(DeviceVerify, AWrongDeviceKernelIsCaughtAsAFailureNamingTheOp) {
  // Control: the fake table's own gelu passes.
  Report right = verify_op(ops::op_registry().get("gelu"), on(kFake));
  ASSERT_TRUE(right.ok()) << right.table();
  ASSERT_GT(right.checks(), 0);
  // Planted: gelu's device kernel computes silu.
  ops::install_device_kernels(DeviceKind::Cuda,
                              fake_table_with(true, [](DeviceKernelTable& t) { t.add_forward("gelu", runs_as("silu")); }));
  Report wrong = verify_op(ops::op_registry().get("gelu"), on(kFake));
  EXPECT_FALSE(wrong.ok());
  ASSERT_FALSE(wrong.failures.empty());
  EXPECT_EQ(wrong.failures[0].op, "gelu");
  EXPECT_NE(wrong.table().find("FAIL gelu on [2]"), std::string::npos) << wrong.table();
  EXPECT_NE(wrong.failures[0].message.find("differs from the single-device result"), std::string::npos)
      << wrong.failures[0].message;
}

TEST_F(DeviceVerify, AKernelTheDeviceRefusesIsASkipWithItsReasonNeverAPass) {
  // gelu's forward refuses (as the CUDA bindings refuse an attribute); the table has no gradient
  // kernel for it (no fallback).
  ops::install_device_kernels(DeviceKind::Cuda, fake_table_with(false, [](DeviceKernelTable& t) {
    t.add_forward("gelu", [](const OpDef& op, In in, const Attrs&, const KernelContext*) -> std::vector<Tensor> {
      throw ops::UnsupportedOnDevice(fmt::format("op '{}' on {}: refused", op.name, in[0].device().to_string()),
                                     "the test kernel does not compute gelu");
    });
  }));
  Report r = verify_op(ops::op_registry().get("gelu"), on(kFake));
  EXPECT_TRUE(r.ok()) << r.table();
  EXPECT_EQ(r.checks(), 0) << r.table();
  EXPECT_EQ(r.passes(), 0);
  ASSERT_EQ(r.rows.size(), 1u);
  EXPECT_EQ(r.rows[0].forward + r.rows[0].grad + r.rows[0].reverse, 0);
  // The CPU run's checks, every one skipped, by part and reason.
  Report cpu = verify_op(ops::op_registry().get("gelu"), on(Device::host()));
  EXPECT_EQ(r.skipped(), cpu.checks());
  std::map<std::string, std::string> why;
  for (const Skip& s : r.skips) why[s.part] = s.reason;
  EXPECT_EQ(why["forward"], "the test kernel does not compute gelu");
  EXPECT_EQ(why["reverse"], "the test kernel does not compute gelu");
  EXPECT_EQ(why["grad"], "no test gradient kernel");
  const std::string table = r.table();
  EXPECT_NE(table.find(fmt::format("on cuda:0 (test kernels): 0 checks ran on the device (0 local kernel runs), {} skipped",
                                   cpu.checks())), std::string::npos) << table;
  EXPECT_NE(table.find("skipped on cuda:0: gelu grad: "), std::string::npos) << table;
}

TEST_F(DeviceVerify, EachRanksInputsGoToTheDeviceAndItsOutputsComeBackAsCountedCopies) {
  VerifyOptions o = on(kFake);
  o.grad = o.reverse = false;
  reset_device_copy_stats();
  Report r = verify_op(ops::op_registry().get("gelu"), o);  // one input, one output
  ASSERT_TRUE(r.ok()) << r.table();
  const DeviceCopyStats copies = device_copy_stats();
  ASSERT_GT(r.rows[0].device_runs, 0);
  EXPECT_EQ(copies.to_device_copies, r.rows[0].device_runs);
  EXPECT_EQ(copies.to_host_copies, r.rows[0].device_runs);
  // On the host: none.
  reset_device_copy_stats();
  Report host = verify_op(ops::op_registry().get("gelu"), on(Device::host()));
  EXPECT_EQ(device_copy_stats().to_device_copies, 0);
  EXPECT_EQ(host.rows[0].device_runs, 0);
  EXPECT_EQ(host.table().find("on cuda"), std::string::npos);
}

TEST_F(DeviceVerify, F64CasesRunInF32WhenAsked) {
  // gelu's cases are f64: as f32 they pass at the f32 tolerance, and the kernels see f32 inputs.
  std::vector<DType> seen;
  ops::install_device_kernels(DeviceKind::Cuda, fake_table_with(true, [&](DeviceKernelTable& t) {
    t.add_forward("gelu", [&seen](const OpDef& op, In in, const Attrs& attrs, const KernelContext* ctx) {
      seen.push_back(in[0].dtype());
      return (*ops::fake_device_kernels()->forward(op.name))(op, in, attrs, ctx);
    });
  }));
  VerifyOptions o = on(kFake);
  o.f64_as_f32 = true;
  Report r = verify_op(ops::op_registry().get("gelu"), o);
  EXPECT_TRUE(r.ok()) << r.table();
  EXPECT_EQ(std::ranges::count(seen, DType::F64), 0);
  EXPECT_GT(std::ranges::count(seen, DType::F32), 0);
  // Without: the kernels see the cases' f64.
  seen.clear();
  EXPECT_TRUE(verify_op(ops::op_registry().get("gelu"), on(kFake)).ok());
  EXPECT_GT(std::ranges::count(seen, DType::F64), 0);
}

// Every op on the fake device: the CPU run's checks, all passed, none skipped (the fake device
// runs the CPU kernels, so a difference is plumbing: copies, views, empty shards, collectives).
// On 1-D meshes of 2 and 3 ranks (even, uneven and empty shards): the plumbing is per rank, and
// test_every_rule.cc proves the rules on the 2-D meshes; [2, 2] made this suite four times the
// whole verifier's test time (the fake device opens and closes its memory around every kernel).
class EveryOpOnTheFakeDevice : public DeviceVerify, public testing::WithParamInterface<std::string> {};

TEST_P(EveryOpOnTheFakeDevice, GivesTheCpuChecksWithNoFailure) {
  const OpDef& op = ops::op_registry().get(GetParam());
  const std::vector<mesh::ProcessMesh> meshes = {mesh::ProcessMesh(Shape{2}), mesh::ProcessMesh(Shape{3})};
  Report cpu = verify_op(op, on(Device::host(), meshes));
  Report fake = verify_op(op, on(kFake, meshes));
  EXPECT_TRUE(fake.ok()) << fake.table();
  EXPECT_EQ(fake.skipped(), 0) << fake.table();
  EXPECT_EQ(fake.passes(), cpu.passes()) << fake.table() << cpu.table();
  EXPECT_GT(fake.passes(), 0);
  int64_t runs = 0;
  for (const Coverage& c : fake.rows) runs += c.device_runs;
  EXPECT_GT(runs, 0);
}

std::vector<std::string> op_names() {
  std::vector<std::string> names;
  for (const OpDef* op : ops::op_registry().all()) names.push_back(op->name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(Ops, EveryOpOnTheFakeDevice, testing::ValuesIn(op_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace shardwise::verify
