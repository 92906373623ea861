#include "shardwise/cuda/memory/cuda_memory.h"

#include <cuda_runtime.h>

#include "shardwise/core/error.h"
#include "shardwise/cuda/memory/buffer_reduce.h"
#include "shardwise/tensor/device_memory.h"

namespace shardwise::cuda {

void check(int status, const char* what) {
  if (status != cudaSuccess) {
    fail("CUDA: {} failed: {} ({})", what, cudaGetErrorString(static_cast<cudaError_t>(status)),
         cudaGetErrorName(static_cast<cudaError_t>(status)));
  }
}

void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

namespace {

cudaStream_t raw(Stream s) { return static_cast<cudaStream_t>(s.handle); }

launch::ReduceElem reduce_elem(DType dtype) {
  switch (dtype) {
    case DType::F32: return launch::ReduceElem::F32;
    case DType::F64: return launch::ReduceElem::F64;
    case DType::F16: return launch::ReduceElem::F16;
    case DType::BF16: return launch::ReduceElem::BF16;
    case DType::I64: return launch::ReduceElem::I64;
    case DType::I32: return launch::ReduceElem::I32;
    case DType::I8: return launch::ReduceElem::I8;
    case DType::U8: return launch::ReduceElem::U8;
    case DType::Bool: return launch::ReduceElem::Bool;
    default: fail("CUDA: no reduction of {} on a device", dtype_name(dtype));
  }
}
static_assert(static_cast<int>(BufferReduce::Prod) == static_cast<int>(launch::ReduceOp::Prod) &&
              static_cast<int>(BufferReduce::Avg) == static_cast<int>(launch::ReduceOp::Avg));

class CudaMemory : public DeviceMemory {
 public:
  explicit CudaMemory(int index) : index_(index) {}
  Device device() const override { return Device::cuda(index_); }
  void* allocate(size_t bytes) override {
    use();
    void* p = nullptr;
    const cudaError_t status = cudaMalloc(&p, bytes);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clear it: the allocator empties its cache and asks again
      return nullptr;
    }
    check(status, "cudaMalloc");
    return p;
  }
  void free(void* ptr) override {
    use();
    check(cudaFree(ptr), "cudaFree");
  }
  // Page-locked host memory for the staging pool (tensor/staging_pool.h), portable to every device;
  // nullptr when the host has none left to lock (the pool then uses pageable memory).
  void* allocate_pinned(size_t bytes) override {
    use();
    void* p = nullptr;
    const cudaError_t status = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    check(status, "cudaHostAlloc");
    return p;
  }
  void free_pinned(void* ptr) override { check(cudaFreeHost(ptr), "cudaFreeHost"); }
  void copy_to_device(void* dst, const void* src, size_t bytes, Stream s) override {
    copy(dst, src, bytes, cudaMemcpyHostToDevice, s);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes, Stream s) override {
    copy(dst, src, bytes, cudaMemcpyDeviceToHost, s);
  }
  void copy_on_device(void* dst, const void* src, size_t bytes, Stream s) override {
    copy(dst, src, bytes, cudaMemcpyDeviceToDevice, s);
  }
  void fill_zero(void* dst, size_t bytes, Stream s) override {
    use();
    check(cudaMemsetAsync(dst, 0, bytes, raw(s)), "cudaMemsetAsync");
  }
  void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes, size_t rows,
               Stream s) override {
    if (rows == 0 || row_bytes == 0) return;
    use();
    if (rows == 1) dst_pitch = src_pitch = row_bytes;  // (cudaMemcpy2D wants pitches >= the width)
    check(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows, cudaMemcpyDeviceToDevice, raw(s)),
          "cudaMemcpy2DAsync");
  }
  void reduce(std::span<const void* const> inputs, void* out, int64_t count, DType dtype, BufferReduce op,
              Stream s) override {
    SW_CHECK(!inputs.empty() && inputs.size() <= launch::kMaxReduceInputs,
             "CUDA: a reduction of {} buffers (1 to {} a launch)", inputs.size(), launch::kMaxReduceInputs);
    use();
    check(launch::reduce_buffers(inputs.data(), static_cast<int>(inputs.size()), out, count, reduce_elem(dtype),
                                 static_cast<launch::ReduceOp>(op), raw(s)),
          "the reduction kernel");
  }
  void synchronize(Stream s) override {
    use();
    check(cudaStreamSynchronize(raw(s)), "cudaStreamSynchronize");
  }
  uint64_t record_event(Stream s) override {
    use();
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventRecord(e, raw(s)), "cudaEventRecord");
    return reinterpret_cast<uint64_t>(e);
  }
  bool event_done(uint64_t event) override {
    const cudaError_t status = cudaEventQuery(reinterpret_cast<cudaEvent_t>(event));
    if (status == cudaErrorNotReady) return false;
    check(status, "cudaEventQuery");
    return true;
  }
  void release_event(uint64_t event) override {
    check(cudaEventDestroy(reinterpret_cast<cudaEvent_t>(event)), "cudaEventDestroy");
  }
  void wait_event(Stream s, uint64_t event) override {
    use();
    check(cudaStreamWaitEvent(raw(s), reinterpret_cast<cudaEvent_t>(event), 0), "cudaStreamWaitEvent");
  }
  Stream create_stream() override { return cuda::create_stream(device()); }
  void destroy_stream(Stream s) override { cuda::destroy_stream(device(), s); }

 private:
  void use() const { check(cudaSetDevice(index_), "cudaSetDevice"); }
  void copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, Stream s) {
    use();
    check(cudaMemcpyAsync(dst, src, bytes, kind, raw(s)), "cudaMemcpyAsync");
  }
  int index_;
};

}  // namespace

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t status = cudaGetDeviceCount(&n);
  if (status != cudaSuccess) {
    if (why != nullptr) *why = cudaGetErrorString(status);
    (void)cudaGetLastError();
    return 0;
  }
  if (n == 0 && why != nullptr) *why = "cudaGetDeviceCount found no device";
  return n;
}

int register_devices() {
  const int n = device_count();
  for (int i = 0; i < n; ++i) register_device_memory(std::make_unique<CudaMemory>(i));
  return n;
}

Stream create_stream(Device device) {
  check(cudaSetDevice(device.index), "cudaSetDevice");
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  return Stream{s};
}

void destroy_stream(Device device, Stream stream) {
  check(cudaSetDevice(device.index), "cudaSetDevice");
  check(cudaStreamDestroy(raw(stream)), "cudaStreamDestroy");
}

void synchronize(Device device, Stream stream) {
  check(cudaSetDevice(device.index), "cudaSetDevice");
  check(cudaStreamSynchronize(raw(stream)), "cudaStreamSynchronize");
}

}  // namespace shardwise::cuda
