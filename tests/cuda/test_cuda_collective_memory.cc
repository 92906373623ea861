// What collectives need from a CUDA device (tensor/device_memory.h): the reduction kernel
// (cuda/memory/buffer_reduce.cu) gives the host loop's bits (tensor/buffer_reduce.h) for every
// dtype and reduction on random data with odd sizes, in place too; cudaMemcpy2DAsync moves exactly a
// box at both pitches; and the threads backend on device buffers of one GPU (ranks as threads,
// comm/device_buffers.h) gives its host path's bits. Skipped, with the reason, where no GPU is present.
#include "cuda_test_util.h"

#include "../support/box_copy_check.h"

#include "shardwise/comm/device_buffers.h"
#include "shardwise/comm/local.h"
#include "shardwise/tensor/buffer_reduce.h"

namespace shardwise::cuda_test {
namespace {

using CudaCollectiveMemory = Gpu;

// Device tensor `d` holds the bytes of host tensor `h`.
bool same_bits(const Tensor& d, const Tensor& h) {
  const Tensor got = to_host(d);
  return got.nbytes() == h.nbytes() && std::memcmp(got.raw(), h.raw(), h.nbytes()) == 0;
}

Tensor random_of(DType dtype, int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-4, 4);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = dtype == DType::Bool ? double(gen() % 2) : std::round(dist(gen) * (is_floating(dtype) ? 1000 : 1)) / (is_floating(dtype) ? 1000 : 1);
  if (n > 3 && is_floating(dtype)) v[0] = -0.0, v[1] = 0.0, v[2] = std::nan("");
  return Tensor::from<double>(Shape{n}, v).to(dtype);
}

TEST_F(CudaCollectiveMemory, TheReductionKernelGivesTheHostLoopsBits) {
  for (DType dtype : {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::I32, DType::I8, DType::U8,
                      DType::Bool}) {
    for (BufferReduce op : {BufferReduce::Sum, BufferReduce::Avg, BufferReduce::Max, BufferReduce::Min,
                            BufferReduce::Prod}) {
      for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, (int64_t{1} << 20) + 3}) {
        for (int ranks : {1, 3, 4}) {
          std::vector<Tensor> host, dev;
          std::vector<const void*> hp, dp;
          for (int r = 0; r < ranks; ++r) {
            host.push_back(random_of(dtype, n, static_cast<unsigned>(r * 17 + n)));
            dev.push_back(to_device(host.back(), kGpu));
            hp.push_back(host.back().raw());
            dp.push_back(dev.back().device_ptr());
          }
          Tensor want(dtype, Shape{n});
          reduce_buffers(hp, want.raw(), n, dtype, op);
          Tensor out = empty_on(dtype, Shape{n}, kGpu);
          device_memory(kGpu).reduce(dp, out.device_ptr(), n, dtype, op, {});
          EXPECT_TRUE(same_bits(out, want)) << dtype_name(dtype) << " op " << int(op) << " n " << n << " ranks " << ranks;
          device_memory(kGpu).reduce(dp, const_cast<void*>(dp[0]), n, dtype, op, {});  // in place
          EXPECT_TRUE(same_bits(dev[0], want)) << "in place: " << dtype_name(dtype) << " op " << int(op);
        }
      }
    }
  }
}

TEST_F(CudaCollectiveMemory, TwoDCopiesMoveExactlyTheBox) { test_support::check_box_copy(kGpu); }

TEST_F(CudaCollectiveMemory, ThreadsOnOneGpuGiveTheHostPathsBits) {
  for (int n : {2, 3, 4}) {
    std::vector<std::pair<Tensor, Tensor>> host(static_cast<size_t>(n)), dev(static_cast<size_t>(n));
    for (bool device : {false, true}) {
      comm::LocalWorld::run(n, [&](comm::Communicator& c) {
        const Tensor in = random_of(DType::BF16, 1001, static_cast<unsigned>(c.rank()));
        const Tensor gathered_in = random_of(DType::F32, c.rank() + 5, static_cast<unsigned>(c.rank() + 50));
        int64_t total = 0;
        std::vector<int64_t> counts;
        for (int r = 0; r < n; ++r) counts.push_back(r + 5), total += r + 5;
        if (!device) {
          Tensor out(DType::BF16, Shape{1001}), gathered(DType::F32, Shape{total});
          c.all_reduce(in.raw(), out.raw(), 1001, DType::BF16, comm::Reduce::Sum);
          c.all_gather_v(gathered_in.raw(), gathered.raw(), counts, DType::F32);
          host[static_cast<size_t>(c.rank())] = {out, gathered};
          return;
        }
        const Stream s = cuda::create_stream(kGpu);
        const Tensor din = to_device(in, kGpu, s), dg = to_device(gathered_in, kGpu, s);
        Tensor out = empty_on(DType::BF16, Shape{1001}, kGpu, s), gathered = empty_on(DType::F32, Shape{total}, kGpu, s);
        {
          comm::DeviceBuffers scope(kGpu, s);
          c.all_reduce(din.device_ptr(), out.device_ptr(), 1001, DType::BF16, comm::Reduce::Sum);
          c.all_gather_v(dg.device_ptr(), gathered.device_ptr(), counts, DType::F32);
        }
        dev[static_cast<size_t>(c.rank())] = {to_host(out, s), to_host(gathered, s)};
        cuda::destroy_stream(kGpu, s);
      });
    }
    auto same = [](const Tensor& a, const Tensor& b) {
      return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
    };
    for (size_t r = 0; r < host.size(); ++r) {
      EXPECT_TRUE(same(host[r].first, dev[r].first)) << "all_reduce, " << n << " ranks, rank " << r;
      EXPECT_TRUE(same(host[r].second, dev[r].second)) << "all_gather_v, " << n << " ranks, rank " << r;
    }
  }
}

}  // namespace
}  // namespace shardwise::cuda_test
