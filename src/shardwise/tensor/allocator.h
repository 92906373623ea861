#pragma once
// The storage of tensors. Small blocks come from the C++ heap. Blocks from kCachedFrom bytes up come
// from a cache that never gives a freed block back to the operating system while the process runs:
// a freed block waits in its size class (eight classes per doubling, so a block is at most 12.5%
// larger than asked) and serves the next request of that class. A training step allocates and
// frees the same large buffers every step; glibc would map and unmap them (blocks above its mmap
// threshold, or above 64 MiB on the heap of a thread other than the main one), and every step
// would fault them in page by page again, the kernel clearing each page. With the cache, a step
// after the first takes no fresh pages. The cache is one per process, shared by the rank threads
// (a mutex; large allocations are few). When the system refuses a new block, the cache is emptied
// and the request tried once more before std::bad_alloc.
#include <cstddef>
#include <cstdint>
#include <memory>

namespace shardwise {

inline constexpr size_t kCachedFrom = size_t{1} << 20;

// `bytes` of storage (at least one byte); zeroed when `zero`. `huge`: a large block is aligned to
// 2 MiB and offered to transparent huge pages (a buffer filled once, as a checkpoint read is).
std::shared_ptr<std::byte[]> allocate_storage(size_t bytes, bool zero, bool huge = false);

struct AllocatorStats {
  int64_t in_use_bytes = 0;       // cached-size blocks held by tensors now (their class sizes)
  int64_t peak_in_use_bytes = 0;  // since the start or reset_peak()
  int64_t cached_bytes = 0;       // freed blocks kept for reuse
  int64_t reserved_bytes = 0;     // in use + cached: what the cache holds from the system
  int64_t requests = 0;           // large allocations asked for
  int64_t reused = 0;             // of them, served from the cache
};
AllocatorStats allocator_stats();
void reset_allocator_peak();
// Gives every cached block back to the system (blocks in use are untouched).
void release_cached_storage();
// The size class a request of `bytes` >= kCachedFrom is served with.
size_t storage_class_size(size_t bytes);

}  // namespace shardwise
