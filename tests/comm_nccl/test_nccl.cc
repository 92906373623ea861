// The nccl backend, on every GPU of the machine (one rank per GPU, ranks are threads of the local
// backend, which carries the NCCL id and the call checks). Skipped where there is no GPU.
#include <gtest/gtest.h>
#include <cuda_runtime_api.h>

#include <numeric>

#include "../comm/collective_checks.h"
#include "shardwise/comm/device_buffers.h"
#include "shardwise/comm/local.h"
#include "shardwise/comm/nccl.h"
#include "shardwise/core/error.h"

namespace shardwise::comm {
namespace {

// A device buffer holding a copy of a host buffer, copied back on request.
class Staged {
 public:
  Staged(const void* host, size_t bytes) : bytes_(bytes) {
    if (bytes_) {
      check(cudaMalloc(&device_, bytes_));
      if (host) check(cudaMemcpy(device_, host, bytes_, cudaMemcpyHostToDevice));
    }
  }
  ~Staged() { cudaFree(device_); }
  void* get() { return device_; }
  void copy_to(void* host) {
    if (bytes_ && host) check(cudaMemcpy(host, device_, bytes_, cudaMemcpyDeviceToHost));
  }

 private:
  static void check(cudaError_t e) {
    if (e != cudaSuccess) fail("CUDA: {}", cudaGetErrorString(e));
  }
  void* device_ = nullptr;
  size_t bytes_;
};

size_t bytes(int64_t count, DType dtype) { return static_cast<size_t>(count) * dtype_size(dtype); }
int64_t total(std::span<const int64_t> counts) { return std::accumulate(counts.begin(), counts.end(), int64_t{0}); }

// Host-buffer Communicator over an NcclComm: copies to the GPU, runs the NCCL call, copies back.
// It lets the backend-independent checks (collective_checks.h) run on NCCL unchanged.
class HostStaged final : public Communicator {
 public:
  explicit HostStaged(std::shared_ptr<Communicator> nccl) : nccl_(std::move(nccl)) {}
  std::string_view backend() const override { return nccl_->backend(); }
  int rank() const override { return nccl_->rank(); }
  int size() const override { return nccl_->size(); }
  const std::vector<int>& members() const override { return nccl_->members(); }
  std::shared_ptr<Communicator> group(std::span<const int> ranks) override {
    return std::make_shared<HostStaged>(nccl_->group(ranks));
  }
  void all_reduce(const void* in, void* out, int64_t count, DType dtype, Reduce op) override {
    Staged i(in, bytes(count, dtype)), o(nullptr, bytes(count, dtype));
    nccl_->all_reduce(i.get(), in == out ? i.get() : o.get(), count, dtype, op);
    (in == out ? i : o).copy_to(out);
  }
  void reduce(const void* in, void* out, int64_t count, DType dtype, Reduce op, int root) override {
    Staged i(in, bytes(count, dtype)), o(nullptr, bytes(count, dtype));
    nccl_->reduce(i.get(), o.get(), count, dtype, op, root);
    if (rank() == root) o.copy_to(out);
  }
  void broadcast(void* buffer, int64_t count, DType dtype, int root) override {
    Staged b(buffer, bytes(count, dtype));
    nccl_->broadcast(b.get(), count, dtype, root);
    b.copy_to(buffer);
  }
  void all_gather(const void* in, void* out, int64_t count, DType dtype) override {
    Staged i(in, bytes(count, dtype)), o(nullptr, bytes(count * size(), dtype));
    nccl_->all_gather(i.get(), o.get(), count, dtype);
    o.copy_to(out);
  }
  void all_gather_v(const void* in, void* out, std::span<const int64_t> counts, DType dtype) override {
    Staged i(in, bytes(counts[static_cast<size_t>(rank())], dtype)), o(nullptr, bytes(total(counts), dtype));
    nccl_->all_gather_v(i.get(), o.get(), counts, dtype);
    o.copy_to(out);
  }
  void reduce_scatter(const void* in, void* out, int64_t count, DType dtype, Reduce op) override {
    Staged i(in, bytes(count * size(), dtype)), o(nullptr, bytes(count, dtype));
    nccl_->reduce_scatter(i.get(), o.get(), count, dtype, op);
    o.copy_to(out);
  }
  void reduce_scatter_v(const void* in, void* out, std::span<const int64_t> counts, DType dtype, Reduce op) override {
    Staged i(in, bytes(total(counts), dtype)), o(nullptr, bytes(counts[static_cast<size_t>(rank())], dtype));
    nccl_->reduce_scatter_v(i.get(), o.get(), counts, dtype, op);
    o.copy_to(out);
  }
  void all_to_all(const void* in, void* out, int64_t count, DType dtype) override {
    Staged i(in, bytes(count * size(), dtype)), o(nullptr, bytes(count * size(), dtype));
    nccl_->all_to_all(i.get(), o.get(), count, dtype);
    o.copy_to(out);
  }
  void all_to_all_v(const void* in, std::span<const int64_t> send_counts, void* out,
                    std::span<const int64_t> recv_counts, DType dtype) override {
    Staged i(in, bytes(total(send_counts), dtype)), o(nullptr, bytes(total(recv_counts), dtype));
    nccl_->all_to_all_v(i.get(), send_counts, o.get(), recv_counts, dtype);
    o.copy_to(out);
  }
  void send(const void* in, int64_t count, DType dtype, int peer, int tag) override {
    Staged i(in, bytes(count, dtype));
    nccl_->send(i.get(), count, dtype, peer, tag);
  }
  void recv(void* out, int64_t count, DType dtype, int peer, int tag) override {
    Staged o(nullptr, bytes(count, dtype));
    nccl_->recv(o.get(), count, dtype, peer, tag);
    o.copy_to(out);
  }
  void barrier() override { nccl_->barrier(); }

 private:
  std::shared_ptr<Communicator> nccl_;
};

int gpus_or_skip_reason(std::string& reason) {
  int n = cuda_device_count();
  if (n == 0) reason = "no CUDA GPU here (cudaGetDeviceCount reports none): the nccl backend is built but not run";
  return std::min(n, 4);
}

TEST(NcclComm, EveryOperationOnEveryGpu) {
  std::string reason;
  int gpus = gpus_or_skip_reason(reason);
  if (gpus == 0) GTEST_SKIP() << reason;
  LocalWorld::run(gpus, [](Communicator& c) {
    auto nccl = std::make_shared<NcclComm>(c.group(c.members()), c.rank());
    EXPECT_EQ(nccl->backend(), "nccl");
    HostStaged staged(nccl);
    checks::all(staged);
  });
}

TEST(NcclComm, SplitByParity) {
  std::string reason;
  int gpus = gpus_or_skip_reason(reason);
  if (gpus == 0) GTEST_SKIP() << reason;
  LocalWorld::run(gpus, [](Communicator& c) {
    auto nccl = std::make_shared<NcclComm>(c.group(c.members()), c.rank());
    auto half = nccl->split(c.rank() % 2, -c.rank());  // reverse order inside each group
    int64_t id = c.rank(), sum = 0;
    HostStaged(half).all_reduce(&id, &sum, 1, DType::I64, Reduce::Sum);
    int64_t want = 0;
    for (int r = c.rank() % 2; r < c.size(); r += 2) want += r;
    if (sum != want) fail("split all_reduce on rank {}: {} != {}", c.rank(), sum, want);
    int expected_rank = 0;
    for (int r = c.rank() + 2; r < c.size(); r += 2) ++expected_rank;  // higher ranks come first
    if (half->rank() != expected_rank) fail("split rank of {}: {} != {}", c.rank(), half->rank(), expected_rank);
  });
}

TEST(NcclComm, MismatchesAreTheSameErrorOnEveryRank) {
  std::string reason;
  int gpus = gpus_or_skip_reason(reason);
  if (gpus < 2) GTEST_SKIP() << (gpus ? "needs 2 GPUs" : reason);
  std::vector<std::string> broadcast_errors(2, "no error");  // per rank
  try {
    LocalWorld::run(2, [&](Communicator& c) {
      HostStaged staged(std::make_shared<NcclComm>(c.group(c.members()), c.rank()));
      std::vector<float> buf(4);
      try {
        staged.broadcast(buf.data(), 4, DType::F32, c.rank());
      } catch (const Error& e) {
        broadcast_errors[static_cast<size_t>(c.rank())] = e.what();
      }
      if (c.rank() == 0) staged.send(buf.data(), 4, DType::F32, 1, 0);
      else staged.recv(buf.data(), 3, DType::F32, 0, 0);
    });
    ADD_FAILURE() << "a receive of 3 elements matched to a send of 4 raised no Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expects 3 elements of f32 (12 bytes) from rank 0 (tag 0), but the message "
                                         "has 16 bytes"),
              std::string::npos)
        << e.what();
  }
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_NE(broadcast_errors[r].find("broadcast: rank 0 uses root 0 but rank 1 uses root 1"), std::string::npos)
        << "rank " << r << ": " << broadcast_errors[r];
  }
}

// Under a DeviceBuffers scope the calls queue on the caller's stream and return at once: the
// result, read after that stream, equals the synchronous call's.
TEST(NcclComm, CallsOnTheCallersStreamGiveTheSynchronousResult) {
  std::string reason;
  int gpus = gpus_or_skip_reason(reason);
  if (gpus == 0) GTEST_SKIP() << reason;
  LocalWorld::run(gpus, [](Communicator& c) {
    NcclComm nccl(c.group(c.members()), c.rank());
    const int64_t n = 1001;
    std::vector<float> in(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) in[static_cast<size_t>(i)] = static_cast<float>(i % 97) * (c.rank() + 1);
    Staged a(in.data(), bytes(n, DType::F32)), sync_out(nullptr, bytes(n, DType::F32)), async_out(nullptr, bytes(n, DType::F32));
    nccl.all_reduce(a.get(), sync_out.get(), n, DType::F32, Reduce::Sum);
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    {
      DeviceBuffers scope(Device::cuda(nccl.device()), Stream{stream});
      nccl.all_reduce(a.get(), async_out.get(), n, DType::F32, Reduce::Sum);
    }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
    sync_out.copy_to(x.data());
    async_out.copy_to(y.data());
    EXPECT_EQ(x, y);
    cudaStreamDestroy(stream);
  });
}

}  // namespace
}  // namespace shardwise::comm
