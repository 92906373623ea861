#include "shardwise/tensor/allocator.h"

#include <malloc.h>
#include <sys/mman.h>

#include <bit>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <vector>

namespace shardwise {
namespace {

constexpr size_t kPage = 4096, kHuge = size_t{2} << 20;
// A free range is cut when what it would leave over is at least this; a smaller rest stays with the
// block (at most 64 KiB lost per block, and no sliver too small for anything).
constexpr size_t kMinSplit = size_t{64} << 10;

// Free page ranges of the normal (4 KiB-page) blocks, indexed by address (to join neighbours) and by
// size (best fit). Ranges from different mappings may join: munmap takes any range of pages.
struct FreeRanges {
  std::map<uintptr_t, size_t> at;                // start -> bytes
  std::multimap<size_t, uintptr_t> by_size;      // bytes -> start

  void insert(uintptr_t start, size_t bytes) {
    at.emplace(start, bytes);
    by_size.emplace(bytes, start);
  }
  void erase(std::map<uintptr_t, size_t>::iterator it) {
    auto [lo, hi] = by_size.equal_range(it->second);
    for (auto s = lo; s != hi; ++s)
      if (s->second == it->first) {
        by_size.erase(s);
        break;
      }
    at.erase(it);
  }
  // Adds [start, start + bytes), joined with free neighbours.
  void give(uintptr_t start, size_t bytes) {
    auto next = at.lower_bound(start);
    if (next != at.end() && start + bytes == next->first) {
      bytes += next->second;
      erase(next);
    }
    auto after = at.lower_bound(start);
    if (after != at.begin()) {
      auto prev = std::prev(after);
      if (prev->first + prev->second == start) {
        start = prev->first;
        bytes += prev->second;
        erase(prev);
      }
    }
    insert(start, bytes);
  }
  // The smallest free range of at least `bytes`, removed; its start and size (0 if none).
  std::pair<uintptr_t, size_t> best_fit(size_t bytes) {
    auto s = by_size.lower_bound(bytes);
    if (s == by_size.end()) return {0, 0};
    const auto found = *s;
    by_size.erase(s);
    at.erase(found.second);
    return {found.second, found.first};
  }
};

struct Cache {
  std::mutex mu;
  FreeRanges ranges;                                    // normal blocks
  std::map<size_t, std::vector<void*>> huge_free;       // 2 MiB-aligned blocks, by exact size
  AllocatorStats stats;
};

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: tensors may be freed during static destruction
  return *c;
}

// A huge block's pages are offered to huge pages up to the last whole 2 MiB of the `used` bytes:
// the tail, in 4 KiB pages, holds only what is touched (a huge page there would make up to 2 MiB
// of a checkpoint's tensor resident for nothing).
void* map_block(size_t size, bool huge, size_t used) {
  const size_t align = huge ? kHuge : kPage;
  // Over-map by the alignment and trim, so a huge block starts on a 2 MiB boundary.
  void* p = ::mmap(nullptr, size + (huge ? align : 0), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  if (!huge) return p;
  auto base = reinterpret_cast<uintptr_t>(p), start = (base + align - 1) / align * align;
  if (start > base) ::munmap(p, start - base);
  if (const uintptr_t tail = base + size + align - (start + size); tail > 0)
    ::munmap(reinterpret_cast<void*>(start + size), tail);
  if (const size_t whole = std::min(size, used / align * align); whole > 0)
    ::madvise(reinterpret_cast<void*>(start), whole, MADV_HUGEPAGE);  // a hint: ignored where huge pages are off
  return reinterpret_cast<void*>(start);
}

void release_locked(Cache& c) {
  for (const auto& [start, bytes] : c.ranges.at) ::munmap(reinterpret_cast<void*>(start), bytes);
  for (auto& [size, blocks] : c.huge_free)
    for (void* p : blocks) ::munmap(p, size);
  c.stats.reserved_bytes -= c.stats.cached_bytes;
  c.stats.cached_bytes = 0;
  c.ranges = {};
  c.huge_free.clear();
}

// A cached block of at least `size` bytes (its real size in `size` on return), or nullptr.
void* reuse_locked(Cache& c, size_t& size, bool huge) {
  if (huge) {
    auto it = c.huge_free.find(size);
    if (it == c.huge_free.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    return p;
  }
  auto [start, bytes] = c.ranges.best_fit(size);
  if (bytes == 0) return nullptr;
  if (bytes - size >= kMinSplit) {
    c.ranges.give(start + size, bytes - size);  // the rest stays free
    bytes = size;
  }
  size = bytes;
  return reinterpret_cast<void*>(start);
}

std::byte* take(size_t& size, bool huge, size_t used, bool& fresh) {
  Cache& c = cache();
  std::lock_guard lock(c.mu);
  ++c.stats.requests;
  void* p = reuse_locked(c, size, huge);
  fresh = p == nullptr;
  if (!fresh) {
    ++c.stats.reused;
    c.stats.cached_bytes -= static_cast<int64_t>(size);
  } else {
    p = map_block(size, huge, used);
    if (!p) {  // the system refuses: give the cache back and try once more
      release_locked(c);
      p = map_block(size, huge, used);
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
  if (huge)
    c.huge_free[size].push_back(p);
  else
    c.ranges.give(reinterpret_cast<uintptr_t>(p), size);
  c.stats.in_use_bytes -= static_cast<int64_t>(size);
  c.stats.cached_bytes += static_cast<int64_t>(size);
}

}  // namespace

size_t storage_request_size(size_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }

std::shared_ptr<std::byte[]> allocate_storage(size_t bytes, bool zero, bool huge) {
  if (bytes < kCachedFrom) {
    // Small blocks: glibc's heap. Keeping 64 MiB at the top of each heap stops glibc handing the
    // emptied top back to the kernel after each step (page faults in the next one).
    static const bool padded = mallopt(M_TOP_PAD, 64 << 20) == 1;
    (void)padded;
    return std::shared_ptr<std::byte[]>(zero ? new std::byte[bytes ? bytes : 1]() : new std::byte[bytes ? bytes : 1]);
  }
  huge = huge && bytes >= 2 * kHuge;
  size_t size = huge ? (bytes + kHuge - 1) / kHuge * kHuge : storage_request_size(bytes);
  bool fresh = false;
  std::byte* p = take(size, huge, bytes, fresh);
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
