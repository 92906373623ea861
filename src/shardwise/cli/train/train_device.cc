#include "shardwise/cli/train/train_device.h"

#include <fmt/format.h>

#include "shardwise/cli/device_option.h"
#include "shardwise/core/error.h"

namespace shardwise::cli {

SelectedDevice select_train_device(const std::string& text, int64_t ranks, bool mpi) {
  if (text == "cpu") return {};
  const bool cuda = text == "cuda" || text.starts_with("cuda:");
  SW_CHECK(cuda || text == "fake", "--device '{}': use cpu, cuda, cuda:N or fake (the tests' device)", text);
  // MPI processes on the fake device reach each other through MPI, which stages device buffers through
  // the host (comm/device_staging.h). On GPUs an mpirun job needs NCCL as its world communicator
  // (comm/nccl.h), chosen in run_ranks (train_run.cc): not wired yet.
  SW_CHECK(!mpi || !cuda, "--device {} under mpirun: MPI processes on GPUs need NCCL as their communicator, which "
           "train does not use yet; run the ranks as threads of one process sharing the GPU (without mpirun), or "
           "--device cpu", text);
  // Registers the device and installs its kernel table (device_option.h); rank threads share it: on
  // a GPU their reshards and collectives are device copies and reductions on it (comm/device_buffers.h).
  const Device d = use_device(text, "--device");
  const std::string on = ranks == 1 ? "1 rank" : fmt::format("{} rank threads", ranks);
  if (!cuda) {
    return {d, "fake",
            fmt::format("device: fake (the tests' device standing in for {}: host memory closed to the host outside "
                        "its copies, the CPU's kernels; {} on it)", d.to_string(), on)};
  }
  return {d, d.to_string(),
          fmt::format("device: {} (parameters, optimizer state and activations in its memory; {} on it)", d.to_string(), on)};
}

}  // namespace shardwise::cli
