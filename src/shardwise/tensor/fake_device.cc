#include "shardwise/tensor/fake_device.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "shardwise/core/error.h"

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
  mapped_ -= it->second.length;
  blocks_.erase(it);
}

void FakeDeviceMemory::open(const void* ptr, size_t bytes) {
  auto* p = static_cast<std::byte*>(const_cast<void*>(ptr));
  auto it = blocks_.upper_bound(p);
  SW_CHECK(it != blocks_.begin(), "fake device: {} is not device memory", ptr);
  --it;
  SW_CHECK(p + bytes <= it->first + it->second.length, "fake device: [{}, +{}) runs past its block", ptr, bytes);
  if (options_.guard) mprotect(it->first, it->second.length, PROT_READ | PROT_WRITE);
}

void FakeDeviceMemory::close(const void* ptr) {
  if (!options_.guard) return;
  auto it = --blocks_.upper_bound(static_cast<std::byte*>(const_cast<void*>(ptr)));
  mprotect(it->first, it->second.length, PROT_NONE);
}

void FakeDeviceMemory::copy_to_device(void* dst, const void* src, size_t bytes, Stream) {
  std::lock_guard lock(mutex_);
  open(dst, bytes);
  std::memcpy(dst, src, bytes);
  close(dst);
}

void FakeDeviceMemory::copy_to_host(void* dst, const void* src, size_t bytes, Stream) {
  std::lock_guard lock(mutex_);
  open(src, bytes);
  std::memcpy(dst, src, bytes);
  close(src);
}

void FakeDeviceMemory::copy_on_device(void* dst, const void* src, size_t bytes, Stream) {
  std::lock_guard lock(mutex_);
  open(src, bytes);
  open(dst, bytes);
  std::memmove(dst, src, bytes);
  close(dst);
  close(src);
}

void FakeDeviceMemory::fill_zero(void* dst, size_t bytes, Stream) {
  std::lock_guard lock(mutex_);
  open(dst, bytes);
  std::memset(dst, 0, bytes);
  close(dst);
}

void FakeDeviceMemory::synchronize(Stream stream) {
  std::lock_guard lock(mutex_);
  for (auto& [id, e] : events_) {
    if (e.first == stream.handle) e.second = true;
  }
}

uint64_t FakeDeviceMemory::record_event(Stream stream) {
  std::lock_guard lock(mutex_);
  events_[next_event_] = {stream.handle, !hold_};
  return next_event_++;
}

bool FakeDeviceMemory::event_done(uint64_t event) {
  std::lock_guard lock(mutex_);
  auto it = events_.find(event);
  SW_CHECK(it != events_.end(), "fake device: no event {}", event);
  return it->second.second;
}

void FakeDeviceMemory::release_event(uint64_t event) {
  std::lock_guard lock(mutex_);
  events_.erase(event);
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
