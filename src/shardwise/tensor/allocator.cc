#include "shardwise/tensor/allocator.h"

#include <malloc.h>
#include <sys/mman.h>

#include <bit>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <vector>

namespace shardwise {
namespace {

constexpr size_t kPage = 4096, kHuge = size_t{2} << 20;

struct Cache {
  std::mutex mu;
  std::map<std::pair<size_t, bool>, std::vector<void*>> free;  // (class size, huge) -> blocks
  AllocatorStats stats;
};

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: tensors may be freed during static destruction
  return *c;
}

void* map_block(size_t size, bool huge) {
  const size_t align = huge ? kHuge : kPage;
  // Over-map by the alignment and trim, so a huge block starts on a 2 MiB boundary.
  void* p = ::mmap(nullptr, size + (huge ? align : 0), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  if (!huge) return p;
  auto base = reinterpret_cast<uintptr_t>(p), start = (base + align - 1) / align * align;
  if (start > base) ::munmap(p, start - base);
  if (const uintptr_t tail = base + size + align - (start + size); tail > 0)
    ::munmap(reinterpret_cast<void*>(start + size), tail);
  ::madvise(reinterpret_cast<void*>(start), size, MADV_HUGEPAGE);  // a hint: ignored where huge pages are off
  return reinterpret_cast<void*>(start);
}

void release_locked(Cache& c) {
  for (auto& [key, blocks] : c.free) {
    for (void* p : blocks) ::munmap(p, key.first);
    c.stats.cached_bytes -= static_cast<int64_t>(key.first * blocks.size());
    c.stats.reserved_bytes -= static_cast<int64_t>(key.first * blocks.size());
  }
  c.free.clear();
}

std::byte* take(size_t size, bool huge, bool& fresh) {
  Cache& c = cache();
  std::lock_guard lock(c.mu);
  ++c.stats.requests;
  auto& blocks = c.free[{size, huge}];
  void* p = nullptr;
  fresh = blocks.empty();
  if (!fresh) {
    p = blocks.back();
    blocks.pop_back();
    ++c.stats.reused;
    c.stats.cached_bytes -= static_cast<int64_t>(size);
  } else {
    p = map_block(size, huge);
    if (!p) {  // the system refuses: give the cache back and try once more
      release_locked(c);
      p = map_block(size, huge);
      if (!p) throw std::bad_alloc();
    }
    c.stats.reserved_bytes += static_cast<int64_t>(size);
  }
  c.stats.in_use_bytes += static_cast<int64_t>(size);
  c.stats.peak_in_use_bytes = std::max(c.stats.peak_in_use_bytes, c.stats.in_use_bytes);
  return static_cast<std::byte*>(p);
}

void give_back(std::byte* p, size_t size, bool huge) {
  Cache& c = cache();
  std::lock_guard lock(c.mu);
  c.free[{size, huge}].push_back(p);
  c.stats.in_use_bytes -= static_cast<int64_t>(size);
  c.stats.cached_bytes += static_cast<int64_t>(size);
}

}  // namespace

size_t storage_class_size(size_t bytes) {
  const size_t pages = (bytes + kPage - 1) / kPage * kPage;
  const size_t step = std::max(kPage, std::bit_floor(pages) / 8);  // eight classes per doubling
  return (pages + step - 1) / step * step;
}

std::shared_ptr<std::byte[]> allocate_storage(size_t bytes, bool zero, bool huge) {
  if (bytes < kCachedFrom) {
    // Small blocks: glibc's heap. Keeping 64 MiB at the top of each heap stops glibc handing the
    // emptied top back to the kernel after each step (page faults in the next one).
    static const bool padded = mallopt(M_TOP_PAD, 64 << 20) == 1;
    (void)padded;
    return std::shared_ptr<std::byte[]>(zero ? new std::byte[bytes ? bytes : 1]() : new std::byte[bytes ? bytes : 1]);
  }
  huge = huge && bytes >= 2 * kHuge;
  const size_t size = huge ? (bytes + kHuge - 1) / kHuge * kHuge : storage_class_size(bytes);
  bool fresh = false;
  std::byte* p = take(size, huge, fresh);
  if (zero && !fresh) std::memset(p, 0, bytes);  // fresh mappings are zero already
  return std::shared_ptr<std::byte[]>(p, [size, huge](std::byte* q) { give_back(q, size, huge); });
}

AllocatorStats allocator_stats() {
  Cache& c = cache();
  std::lock_guard lock(c.mu);
  return c.stats;
}

void reset_allocator_peak() {
  Cache& c = cache();
  std::lock_guard lock(c.mu);
  c.stats.peak_in_use_bytes = c.stats.in_use_bytes;
}

void release_cached_storage() {
  Cache& c = cache();
  std::lock_guard lock(c.mu);
  release_locked(c);
}

}  // namespace shardwise
