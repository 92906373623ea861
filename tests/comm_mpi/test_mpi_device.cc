// MPI on device buffers (comm/device_staging.h) on the fake device, on every rank of the mpirun job:
// every collective and send / recv of the shared cases (tests/comm/device_cases.h: uneven counts,
// empty shards, bf16 sums) gives, with device buffers staged through the host, the bits of the same
// call with host buffers; the device memory is PROT_NONE outside the fake device's own copies, so a
// device pointer handed to MPI as it is would die here.
#include <gtest/gtest.h>

#include <cstring>

#include "../comm/device_cases.h"
#include "shardwise/comm/mpi.h"
#include "shardwise/comm/routed.h"
#include "shardwise/tensor/fake_device.h"

namespace shardwise::comm {
namespace {

const Device kFake = Device::cuda(3);

TEST(MpiDevice, EveryCaseStagedGivesTheHostBuffersBits) {
  static FakeDeviceMemory& fake = register_fake_device({.index = 3});
  (void)fake;
  Communicator& world = *mpi_world();
  for (const device_cases::Case& c : device_cases::cases()) {
    const Tensor host = device_cases::run_case(world, c, Device::host());
    const Tensor device = device_cases::run_case(world, c, kFake);
    ASSERT_EQ(host.nbytes(), device.nbytes()) << c.name;
    EXPECT_EQ(std::memcmp(host.raw(), device.raw(), host.nbytes()), 0) << c.name << " on rank " << world.rank();
  }
}

TEST(MpiDevice, AStagedAllReduceSumsEveryRanksValues) {
  static FakeDeviceMemory& fake = register_fake_device({.index = 3});
  (void)fake;
  Communicator& world = *mpi_world();
  const Tensor in = to_device(Tensor::from<float>(Shape{3}, {1, 2, float(world.rank())}), kFake);
  Tensor out = empty_on(DType::F32, Shape{3}, kFake);
  {
    DeviceBuffers scope(kFake, {});
    world.all_reduce(in.device_ptr(), out.device_ptr(), 3, DType::F32, Reduce::Sum);
  }
  const Tensor got = to_host(out);
  const int n = world.size();
  EXPECT_EQ(got.at(0), n);
  EXPECT_EQ(got.at(2), n * (n - 1) / 2);
}

// The world of `train --device cuda` under mpirun with MPI standing in for NCCL (comm/routed.h): the
// world and a duplicate of it (MpiComm::dup: the same ranks, its own messages). Every case's device
// buffers go to the duplicate, its host buffers to the world, each with the host path's bits.
TEST(MpiDevice, ARoutedWorldSendsDeviceBuffersToItsDeviceSideWithTheHostBuffersBits) {
  static FakeDeviceMemory& fake = register_fake_device({.index = 3});
  (void)fake;
  std::shared_ptr<MpiComm> world = mpi_world(), copy = world->dup();
  EXPECT_NE(copy->native(), world->native());
  EXPECT_EQ(copy->members(), world->members());
  RoutedComm routed(world, copy);
  EXPECT_EQ(routed.backend(), "mpi+mpi");
  for (const device_cases::Case& c : device_cases::cases()) {
    const int64_t device_calls = routed.routes().device.load(), host_calls = routed.routes().host.load();
    const Tensor host = device_cases::run_case(routed, c, Device::host());
    EXPECT_EQ(routed.routes().device.load(), device_calls) << c.name;
    const Tensor device = device_cases::run_case(routed, c, kFake);
    EXPECT_GT(routed.routes().device.load(), device_calls) << c.name;
    EXPECT_EQ(routed.routes().host.load(), host_calls + (routed.routes().device.load() - device_calls)) << c.name << ": as many each way";
    ASSERT_EQ(host.nbytes(), device.nbytes()) << c.name;
    EXPECT_EQ(std::memcmp(host.raw(), device.raw(), host.nbytes()), 0) << c.name << " on rank " << world->rank();
  }
}

}  // namespace
}  // namespace shardwise::comm
