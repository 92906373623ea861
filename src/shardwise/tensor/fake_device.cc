#include "shardwise/tensor/fake_device.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "shardwise/core/error.h"
#include "shardwise/tensor/current_stream.h"

namespace shardwise {

namespace {
size_t page_size() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}
}  // namespace

FakeDeviceMemory::FakeDeviceMemory(Options options) : options_(options) {}

FakeDeviceMemory::~FakeDeviceMemory() {
  for (auto& [ptr, m] : blocks_) munmap(ptr, m.length);
}

void* FakeDeviceMemory::allocate(size_t bytes) {
  const size_t length = (std::max<size_t>(bytes, 1) + page_size() - 1) / page_size() * page_size();
  std::lock_guard lock(mutex_);
  if (mapped_ + length > options_.capacity) return nullptr;
  void* p = mmap(nullptr, length, options_.guard ? PROT_NONE : PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  SW_CHECK(p != MAP_FAILED, "fake device: mmap of {} bytes failed", length);
  blocks_[static_cast<std::byte*>(p)] = {length};
  mapped_ += length;
  return p;
}

void FakeDeviceMemory::free(void* ptr) {
  std::lock_guard lock(mutex_);
  auto it = blocks_.find(static_cast<std::byte*>(ptr));
  SW_CHECK(it != blocks_.end(), "fake device: free of {}, which it never gave out", ptr);
  munmap(it->first, it->second.length);
  order_.forget(reinterpret_cast<uintptr_t>(it->first), it->second.length);
  mapped_ -= it->second.length;
  blocks_.erase(it);
}

std::map<std::byte*, FakeDeviceMemory::Mapping>::iterator FakeDeviceMemory::block_of(const void* ptr) {
  auto* p = static_cast<std::byte*>(const_cast<void*>(ptr));
  auto it = blocks_.upper_bound(p);
  SW_CHECK(it != blocks_.begin(), "fake device: {} is not device memory", ptr);
  --it;
  SW_CHECK(p < it->first + it->second.length, "fake device: {} is not device memory", ptr);
  return it;
}

void FakeDeviceMemory::open(const void* ptr, size_t bytes) {
  auto it = block_of(ptr);
  SW_CHECK(static_cast<const std::byte*>(ptr) + bytes <= it->first + it->second.length,
           "fake device: [{}, +{}) runs past its block", ptr, bytes);
  if (options_.guard && it->second.opened++ == 0) mprotect(it->first, it->second.length, PROT_READ | PROT_WRITE);
}

void FakeDeviceMemory::close(const void* ptr) {
  if (!options_.guard) return;
  auto it = block_of(ptr);
  if (--it->second.opened == 0) mprotect(it->first, it->second.length, PROT_NONE);
}

void FakeDeviceMemory::note_access(Stream stream, const void* ptr, size_t bytes, bool write, const char* what) {
  if (options_.check_streams) order_.access(stream.handle, reinterpret_cast<uintptr_t>(ptr), bytes, write, what);
}

void FakeDeviceMemory::open_for_host(const void* ptr, size_t bytes, bool write) {
  const Stream stream = current_stream();
  std::lock_guard lock(mutex_);
  log_.push_back({StreamEvent::Kind::HostOpen, stream.handle, 0});
  open(ptr, bytes);
  note_access(stream, ptr, bytes, write, write ? "a kernel's access" : "a kernel's read");
}

void FakeDeviceMemory::close_for_host(const void* ptr) {
  std::lock_guard lock(mutex_);
  close(ptr);
}

bool FakeDeviceMemory::owns(const void* ptr) const {
  std::lock_guard lock(mutex_);
  auto* p = static_cast<std::byte*>(const_cast<void*>(ptr));
  auto it = blocks_.upper_bound(p);
  if (it == blocks_.begin()) return false;
  --it;
  return p < it->first + it->second.length;
}

void FakeDeviceMemory::copy_to_device(void* dst, const void* src, size_t bytes, Stream stream) {
  std::lock_guard lock(mutex_);
  log_.push_back({StreamEvent::Kind::CopyToDevice, stream.handle, 0});
  open(dst, bytes);
  note_access(stream, dst, bytes, true, "a copy from the host");
  std::memcpy(dst, src, bytes);
  close(dst);
}

void FakeDeviceMemory::copy_to_host(void* dst, const void* src, size_t bytes, Stream stream) {
  std::lock_guard lock(mutex_);
  log_.push_back({StreamEvent::Kind::CopyToHost, stream.handle, 0});
  open(src, bytes);
  note_access(stream, src, bytes, false, "a copy to the host");
  std::memcpy(dst, src, bytes);
  close(src);
}

void FakeDeviceMemory::copy_on_device(void* dst, const void* src, size_t bytes, Stream stream) {
  std::lock_guard lock(mutex_);
  open(src, bytes);
  open(dst, bytes);
  note_access(stream, src, bytes, false, "a device copy's read");
  note_access(stream, dst, bytes, true, "a device copy's write");
  std::memmove(dst, src, bytes);
  close(dst);
  close(src);
}

void FakeDeviceMemory::fill_zero(void* dst, size_t bytes, Stream stream) {
  std::lock_guard lock(mutex_);
  log_.push_back({StreamEvent::Kind::Fill, stream.handle, 0});
  open(dst, bytes);
  note_access(stream, dst, bytes, true, "a zero fill");
  std::memset(dst, 0, bytes);
  close(dst);
}

void FakeDeviceMemory::copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes,
                               size_t rows, Stream stream) {
  if (rows == 0 || row_bytes == 0) return;
  SW_CHECK(rows == 1 || (dst_pitch >= row_bytes && src_pitch >= row_bytes),
           "fake device: a 2-D copy of rows of {} bytes with pitches {} (destination) and {} (source)", row_bytes,
           dst_pitch, src_pitch);
  const size_t dst_span = (rows - 1) * dst_pitch + row_bytes, src_span = (rows - 1) * src_pitch + row_bytes;
  std::lock_guard lock(mutex_);
  open(src, src_span);
  open(dst, dst_span);
  for (size_t r = 0; r < rows && options_.check_streams; ++r) {  // row by row: the pitches' gaps are not touched
    note_access(stream, static_cast<const std::byte*>(src) + r * src_pitch, row_bytes, false, "a 2-D copy's read");
    note_access(stream, static_cast<std::byte*>(dst) + r * dst_pitch, row_bytes, true, "a 2-D copy's write");
  }
  for (size_t r = 0; r < rows; ++r) {
    std::memmove(static_cast<std::byte*>(dst) + r * dst_pitch, static_cast<const std::byte*>(src) + r * src_pitch,
                 row_bytes);
  }
  close(dst);
  close(src);
}

void FakeDeviceMemory::reduce(std::span<const void* const> inputs, void* out, int64_t count, DType dtype,
                              BufferReduce op, Stream stream) {
  SW_CHECK(!inputs.empty(), "fake device: a reduction of no buffers");
  SW_CHECK(count >= 0, "fake device: a reduction of {} elements", count);
  if (count == 0) return;
  const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
  std::lock_guard lock(mutex_);
  for (const void* in : inputs) open(in, bytes);
  open(out, bytes);
  for (const void* in : inputs) note_access(stream, in, bytes, false, "a reduction's read");
  note_access(stream, out, bytes, true, "a reduction's write");
  reduce_buffers(inputs, out, count, dtype, op);
  close(out);
  for (const void* in : inputs) close(in);
}

void FakeDeviceMemory::synchronize(Stream stream) {
  std::lock_guard lock(mutex_);
  log_.push_back({StreamEvent::Kind::Synchronize, stream.handle, 0});
  order_.synchronize(stream.handle);
  for (auto& [id, e] : events_) {
    if (e.first == stream.handle) e.second = true;
  }
}

uint64_t FakeDeviceMemory::record_event(Stream stream) {
  std::lock_guard lock(mutex_);
  events_[next_event_] = {stream.handle, !hold_};
  log_.push_back({StreamEvent::Kind::Record, stream.handle, next_event_});
  order_.record(stream.handle, next_event_);
  return next_event_++;
}

bool FakeDeviceMemory::event_done(uint64_t event) {
  std::lock_guard lock(mutex_);
  auto it = events_.find(event);
  SW_CHECK(it != events_.end(), "fake device: no event {}", event);
  if (it->second.second) order_.event_seen(event);
  return it->second.second;
}

void FakeDeviceMemory::release_event(uint64_t event) {
  std::lock_guard lock(mutex_);
  events_.erase(event);
  order_.release(event);
}

void FakeDeviceMemory::wait_event(Stream stream, uint64_t event) {
  std::lock_guard lock(mutex_);
  SW_CHECK(events_.contains(event), "fake device: a wait for event {}, which is not recorded (or released)", event);
  log_.push_back({StreamEvent::Kind::Wait, stream.handle, event});
  order_.wait(stream.handle, event);
}

Stream FakeDeviceMemory::create_stream() {
  std::lock_guard lock(mutex_);
  return Stream{reinterpret_cast<void*>(next_stream_++)};
}

void FakeDeviceMemory::destroy_stream(Stream stream) {
  SW_CHECK(stream.handle != nullptr, "fake device: the default stream is not destroyed");
}

void FakeDeviceMemory::note_launch(Stream stream) {
  std::lock_guard lock(mutex_);
  log_.push_back({StreamEvent::Kind::Launch, stream.handle, 0});
}

std::vector<FakeDeviceMemory::StreamEvent> FakeDeviceMemory::stream_log() const {
  std::lock_guard lock(mutex_);
  return log_;
}

void FakeDeviceMemory::clear_stream_log() {
  std::lock_guard lock(mutex_);
  log_.clear();
}

std::vector<std::string> FakeDeviceMemory::stream_races() const {
  std::lock_guard lock(mutex_);
  return order_.races();
}

void FakeDeviceMemory::clear_stream_races() {
  std::lock_guard lock(mutex_);
  order_.clear_races();
}

void FakeDeviceMemory::hold_events(bool hold) {
  std::lock_guard lock(mutex_);
  hold_ = hold;
}

void FakeDeviceMemory::complete_events() {
  std::lock_guard lock(mutex_);
  for (auto& [id, e] : events_) e.second = true;
}

size_t FakeDeviceMemory::bytes_mapped() const {
  std::lock_guard lock(mutex_);
  return mapped_;
}

size_t FakeDeviceMemory::live_events() const {
  std::lock_guard lock(mutex_);
  return events_.size();
}

FakeDeviceMemory& register_fake_device(FakeDeviceMemory::Options options) {
  auto owned = std::make_unique<FakeDeviceMemory>(options);
  FakeDeviceMemory& fake = *owned;
  register_device_memory(std::move(owned));
  return fake;
}

}  // namespace shardwise
