#include "shardwise/cuda/memory/cuda_memory.h"

#include <cuda_runtime.h>

#include "shardwise/core/error.h"
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
