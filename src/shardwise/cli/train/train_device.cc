#include "shardwise/cli/train/train_device.h"

#include <fmt/format.h>

#include <algorithm>

#include "shardwise/cli/device_option.h"
#include "shardwise/comm/mpi.h"
#include "shardwise/core/error.h"
#ifdef SHARDWISE_CLI_CUDA
#include "shardwise/cuda/memory/cuda_memory.h"
#endif

namespace shardwise::cli {

namespace {

// The GPUs this process sees (0 without CUDA or a GPU).
int visible_gpus() {
#ifdef SHARDWISE_CLI_CUDA
  return std::max(cuda::device_count(), 0);
#else
  return 0;
#endif
}

// Under mpirun each process takes one GPU of its node, by its rank on the node (comm::mpi_local_rank):
// --device cuda is cuda:(local rank % the GPUs the process sees), so CUDA_VISIBLE_DEVICES chooses the
// node's GPUs (one each, or all of them). cuda:N names one GPU: a job of one process only. NCCL is
// the communicator between the processes' GPUs (run_ranks, train_world.h).
std::string mpi_process_gpu(const std::string& text, int64_t ranks) {
#ifndef SHARDWISE_CLI_NCCL
  (void)ranks;
  fail("--device {} under mpirun: MPI processes on GPUs need NCCL as their communicator, and this shardwise was built "
       "without it (SHARDWISE_WITH_NCCL: configure where the CUDA toolkit and NCCL are found, -DSHARDWISE_WITH_NCCL=ON "
       "to insist); run the ranks as threads of one process sharing the GPU (without mpirun), or --device cpu", text);
#else
  SW_CHECK(text == "cuda" || ranks == 1, "--device {} under mpirun: cuda:N names one GPU, but each of the {} processes "
           "needs its own; use --device cuda (the process of local rank L on cuda:(L % the GPUs it sees)), and "
           "CUDA_VISIBLE_DEVICES to choose a node's GPUs", text, ranks);
  if (text != "cuda") return text;
  use_device(text, "--device");  // a GPU is visible, or the Error saying why not
  const int local = comm::mpi_local_rank();
  SW_CHECK(local >= 0, "--device cuda under mpirun: this process's rank on its node is unknown (none of "
           "OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, MV2_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID is set)");
  return fmt::format("cuda:{}", local % visible_gpus());
#endif
}

}  // namespace

std::string threads_on_one_gpu(int64_t ranks, int gpus) {
  std::string on = ranks == 1 ? "1 rank on it" : fmt::format("{} rank threads on it", ranks);
  if (gpus <= 1 || ranks <= 1) return on;
  return fmt::format("{}; the other {} GPUs this process sees stay idle: `mpirun -np {} shardwise train --device cuda "
                     "...` runs a process on each", on, gpus - 1, std::min<int64_t>(ranks, gpus));
}

SelectedDevice select_train_device(const std::string& text, int64_t ranks, bool mpi) {
  if (text == "cpu") return {};
  const bool cuda = text == "cuda" || text.starts_with("cuda:");
  SW_CHECK(cuda || text == "fake", "--device '{}': use cpu, cuda, cuda:N or fake (the tests' device)", text);
  // MPI processes on the fake device reach each other through MPI, which stages device buffers through
  // the host (comm/device_staging.h); on GPUs each process takes its node's GPU of its local rank, and
  // the world communicator routes device-buffer calls to NCCL (train_world.h).
  const std::string name = mpi && cuda ? mpi_process_gpu(text, ranks) : text;
  // Registers the device and installs its kernel table (device_option.h); rank threads share it: on
  // a GPU their reshards and collectives are device copies and reductions on it (comm/device_buffers.h).
  const Device d = use_device(name, "--device");
  const std::string on = !mpi ? threads_on_one_gpu(ranks, cuda ? visible_gpus() : 0)
                         : cuda ? fmt::format("one of the {} MPI processes' GPUs, NCCL between them", ranks)
                                : fmt::format("{} MPI processes on it, MPI between them", ranks);
  if (!cuda) {
    return {d, "fake",
            fmt::format("device: fake (the tests' device standing in for {}: host memory closed to the host outside "
                        "its copies, the CPU's kernels; {})", d.to_string(), on)};
  }
  return {d, d.to_string(),
          fmt::format("device: {} (parameters, optimizer state and activations in its memory; {})", d.to_string(), on)};
}

}  // namespace shardwise::cli
