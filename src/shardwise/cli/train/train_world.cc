#include "shardwise/cli/train/train_world.h"

#include <fmt/format.h>

#include <cstdlib>
#include <string_view>

#include "shardwise/comm/mpi.h"
#include "shardwise/comm/routed.h"
#include "shardwise/core/error.h"
#ifdef SHARDWISE_CLI_NCCL
#include "shardwise/comm/nccl.h"
#endif

namespace shardwise::cli {

namespace {
bool test_switch() {
  const char* value = std::getenv("SHARDWISE_TEST_ROUTE_DEVICE_COMM");
  return value && std::string_view(value) == "1";
}
}  // namespace

std::shared_ptr<comm::Communicator> mpi_train_world(const PreparedRun& run) {
  std::shared_ptr<comm::MpiComm> world = comm::mpi_world();
  const bool fake = run.o.device_name == "fake", gpu = !run.c.device.is_host() && !fake;
  if (fake && test_switch()) return std::make_shared<comm::RoutedComm>(world, world->dup());
  if (!gpu) return world;
#ifdef SHARDWISE_CLI_NCCL
  // NCCL's call checks and size headers travel on a duplicate, apart from the host side's calls.
  auto nccl = std::make_shared<comm::NcclComm>(world->dup(), run.c.device.index);
  return std::make_shared<comm::RoutedComm>(world, std::move(nccl));
#else
  fail("--device {} under mpirun needs the NCCL backend, which this shardwise was built without (SHARDWISE_WITH_NCCL)",
       run.o.device_name);
#endif
}

void report_routes(const comm::Communicator& world, std::ostream& err) {
  const auto* routed = dynamic_cast<const comm::RoutedComm*>(&world);
  if (!routed || !test_switch()) return;
  err << fmt::format("routed world: rank {}: {} calls on the device side ({}), {} on the host side ({})\n", world.rank(),
                     routed->routes().device.load(), routed->device().backend(), routed->routes().host.load(),
                     routed->host().backend());
}

}  // namespace shardwise::cli
