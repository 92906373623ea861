#pragma once
// A fake device for tests without a GPU: host memory pretending to be device memory. With `guard`
// (the default) every block it hands out is mapped PROT_NONE and opened only inside its own copy
// and reduction calls (the host loops of the CUDA backend's copies and kernels), so host code that dereferences device memory dies with SIGSEGV on the CPU: `make test`
// guards the host/device boundary without a GPU. Copies run at once, whatever the stream; events
// pass at once unless hold_events(true), then when complete_events() or synchronize() of their
// stream says so (how the allocator's stream ordering is tested).
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "shardwise/tensor/device_memory.h"
#include "shardwise/tensor/stream_order.h"

namespace shardwise {

class FakeDeviceMemory : public DeviceMemory {
 public:
  struct Options {
    int index = 0;
    size_t capacity = size_t{1} << 30;  // allocate() answers nullptr beyond this many bytes
    bool guard = true;                  // blocks PROT_NONE outside the copy calls
    bool check_streams = true;          // stream_races(): accesses no event or host wait orders
  };
  explicit FakeDeviceMemory(Options options);
  ~FakeDeviceMemory() override;

  Device device() const override { return Device::cuda(options_.index); }
  void* allocate(size_t bytes) override;
  void free(void* ptr) override;
  void copy_to_device(void* dst, const void* src, size_t bytes, Stream stream) override;
  void copy_to_host(void* dst, const void* src, size_t bytes, Stream stream) override;
  void copy_on_device(void* dst, const void* src, size_t bytes, Stream stream) override;
  void fill_zero(void* dst, size_t bytes, Stream stream) override;
  void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes, size_t rows,
               Stream stream) override;
  void reduce(std::span<const void* const> inputs, void* out, int64_t count, DType dtype, BufferReduce op,
              Stream stream) override;
  void synchronize(Stream stream) override;
  uint64_t record_event(Stream stream) override;
  bool event_done(uint64_t event) override;
  void release_event(uint64_t event) override;
  void wait_event(Stream stream, uint64_t event) override;
  Stream create_stream() override;
  void destroy_stream(Stream stream) override;

  // What was asked of its streams, in order (the ordering rules of the runtime on streams are
  // tested on these): kernels launched (note_launch, by the fake kernel table), zero fills, events
  // recorded and waited for, host synchronisations, host copies, and host windows opened (open_for_host, on the
  // opening thread's current stream: which work looked at device memory from the host).
  struct StreamEvent {
    enum class Kind { Launch, Fill, Record, Wait, Synchronize, CopyToHost, CopyToDevice, HostOpen };
    Kind kind;
    void* stream = nullptr;  // Stream::handle
    uint64_t event = 0;      // Record, Wait
  };
  void note_launch(Stream stream);
  std::vector<StreamEvent> stream_log() const;
  void clear_stream_log();

  // Opens the block holding [ptr, ptr + bytes) for host access until as many close_for_host calls
  // (windows nest and may overlap across threads): the fake device's kernels run CPU kernels on its
  // memory inside such a window (ops/fake_device_kernels.h). A clear error when it is no block's.
  // `write`: the host may write there (a read-only window is checked as a read by stream_races).
  void open_for_host(const void* ptr, size_t bytes, bool write = true);
  void close_for_host(const void* ptr);
  // Whether `ptr` lies in one of its blocks.
  bool owns(const void* ptr) const;

  // Accesses on one stream to memory another stream used, with no event or host wait between
  // (tensor/stream_order.h): races on a GPU. With Options::check_streams.
  std::vector<std::string> stream_races() const;
  void clear_stream_races();

  void hold_events(bool hold);
  void complete_events();
  size_t bytes_mapped() const;
  size_t live_events() const;

 private:
  struct Mapping {
    size_t length = 0;
    int opened = 0;  // open() calls without their close()
  };
  // The block holding [ptr, ptr + bytes) (a clear error when none does), opened for the call.
  void open(const void* ptr, size_t bytes);
  void close(const void* ptr);
  // An access for the race check (Options::check_streams), under the lock.
  void note_access(Stream stream, const void* ptr, size_t bytes, bool write, const char* what);
  std::map<std::byte*, Mapping>::iterator block_of(const void* ptr);

  Options options_;
  mutable std::mutex mutex_;
  std::map<std::byte*, Mapping> blocks_;
  size_t mapped_ = 0;
  bool hold_ = false;
  uint64_t next_event_ = 1;
  std::map<uint64_t, std::pair<void*, bool>> events_;  // id -> (stream handle, done)
  uintptr_t next_stream_ = 1;
  std::vector<StreamEvent> log_;
  StreamOrder order_;
};

// Registers a fake device as cuda:`index` (device_memory.h) and returns it (owned by the registry).
FakeDeviceMemory& register_fake_device(FakeDeviceMemory::Options options);

}  // namespace shardwise
