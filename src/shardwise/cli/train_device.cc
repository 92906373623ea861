#include "shardwise/cli/train_device.h"

#include <fmt/format.h>

#include <charconv>

#include "shardwise/core/error.h"
#include "shardwise/ops/fake_device_kernels.h"
#include "shardwise/tensor/device_memory.h"
#include "shardwise/tensor/fake_device.h"
#ifdef SHARDWISE_CLI_CUDA
#include "shardwise/cuda/memory/cuda_memory.h"
#include "shardwise/cuda_ops/bind.h"
#endif

namespace shardwise::cli {

namespace {

// The GPU of "cuda" (0) or "cuda:N".
int cuda_index(const std::string& text) {
  if (text == "cuda") return 0;
  int index = -1;
  const char* begin = text.data() + 5;
  const char* end = text.data() + text.size();
  const auto [at, ec] = std::from_chars(begin, end, index);
  SW_CHECK(ec == std::errc() && at == end && index >= 0, "--device {}: a GPU is cuda or cuda:N (N from 0)", text);
  return index;
}

SelectedDevice select_fake(int64_t ranks) {
  // Each rank's parameters, state and activations share it: room for tiny and small models.
  register_fake_device({.index = 0, .capacity = size_t{16} << 30});
  ops::install_device_kernels(DeviceKind::Cuda, ops::fake_device_kernels());
  return {Device::cuda(0), "fake",
          fmt::format("device: fake (the tests' device standing in for cuda:0: host memory closed to the host outside "
                      "its copies, the CPU's kernels; {} on it)", ranks == 1 ? "1 rank" : fmt::format("{} rank threads", ranks))};
}

SelectedDevice select_cuda(const std::string& text, int64_t ranks) {
  const int index = cuda_index(text);
#ifdef SHARDWISE_CLI_CUDA
  std::string why;
  const int count = cuda::device_count(&why);
  SW_CHECK(count > 0, "--device {}: no GPU is visible to this process ({})", text, why.empty() ? "CUDA found none" : why);
  SW_CHECK(index < count, "--device {}: this process sees {} GPU{} (cuda:0{})", text, count, count == 1 ? "" : "s",
           count == 1 ? "" : fmt::format(" to cuda:{}", count - 1));
  // Rank threads share the one GPU (how multi-rank logic is tested on one GPU): their reshards and
  // collectives are device copies and reductions on it (comm/device_buffers.h).
  cuda::register_devices();
  cuda_ops::install_cuda_kernels();
  const Device d = Device::cuda(index);
  return {d, d.to_string(), fmt::format("device: {} (parameters, optimizer state and activations in its memory; {})",
                                        d.to_string(), ranks == 1 ? "1 rank" : fmt::format("{} rank threads on it", ranks))};
#else
  (void)index, (void)ranks;
  fail("--device {}: this shardwise was built without CUDA (configure on a machine with the CUDA toolkit, "
       "-DSHARDWISE_WITH_CUDA=ON); use --device cpu", text);
#endif
}

}  // namespace

SelectedDevice select_train_device(const std::string& text, int64_t ranks, bool mpi) {
  if (text == "cpu") return {};
  const bool cuda = text == "cuda" || text.starts_with("cuda:");
  SW_CHECK(cuda || text == "fake", "--device '{}': use cpu, cuda, cuda:N or fake (the tests' device)", text);
  // MPI processes on a device need their world communicator on device memory, chosen in run_ranks
  // (train_run.cc): not built yet.
  SW_CHECK(!mpi, "--device {} under mpirun: MPI processes on a device need collectives on device memory outside the "
           "graph (NCCL, or MPI staging through the host; not built yet); run the ranks as threads of one process "
           "(without mpirun), or --device cpu", text);
  return cuda ? select_cuda(text, ranks) : select_fake(ranks);
}

}  // namespace shardwise::cli
