#pragma once
// The world communicator of a `train` process under mpirun (run_ranks, train_run.h):
// - --device cpu or fake: the MPI world (MPI stages fake-device buffers through the host,
//   comm/device_staging.h);
// - --device cuda (this process's GPU, train_device.h): RoutedComm(MPI world, NcclComm over a
//   duplicate of the MPI world on that GPU) (comm/routed.h): the device-buffer calls on NCCL, the
//   host-buffer calls (losses, metadata, checkpoint coordination, data) on MPI. Built only where
//   CUDA and NCCL are (SHARDWISE_WITH_NCCL); select_train_device refuses the run elsewhere.
// - test only: with SHARDWISE_TEST_ROUTE_DEVICE_COMM=1 in the environment, a --device fake run takes
//   RoutedComm(MPI world, a duplicate of it) as its world, the stand-in for MPI + NCCL that proves
//   on the CPU that the trainer makes every device-buffer call under a DeviceBuffers scope, and
//   report_routes prints each rank's routed calls (tests/cli/device/test_cli_device.cc).
#include <memory>
#include <ostream>

#include "shardwise/cli/train/train_run.h"
#include "shardwise/comm/communicator.h"

namespace shardwise::cli {

// This process's world for `run` (collective over the MPI world).
std::shared_ptr<comm::Communicator> mpi_train_world(const PreparedRun& run);

// Under the test switch, one line to `err` for a routed world:
// "routed world: rank R: D calls on the device side (B), H on the host side (B)".
void report_routes(const comm::Communicator& world, std::ostream& err);

}  // namespace shardwise::cli
