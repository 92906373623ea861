#pragma once
// The storage of tensors. Small blocks come from the C++ heap. Blocks from kCachedFrom bytes up come
// from a cache that never gives a freed block back to the operating system while the process runs.
// A training step allocates and frees the same large buffers every step; glibc would map and unmap
// them (blocks above its mmap threshold, or above 64 MiB on the heap of a thread other than the main
// one), and every step would fault them in page by page again, the kernel clearing each page. With
// the cache, a step after the first takes no fresh pages.
//
// A request is rounded up to whole pages and served best fit from the freed page ranges: the
// smallest free range that holds it, cut when the rest is 64 KiB or more (the rest stays free). A
// freed block joins its free neighbours, so the buffers of one phase of a step (the backward's
// large gradients) can be cut out of those of another (the forward's activations) instead of each
// size keeping its own blocks. Only when no free range fits is a new block mapped. Huge-page blocks
// (2 MiB aligned, for buffers filled once, as a checkpoint read is) are kept apart, by exact size.
// The cache is one per process, shared by the rank threads (a mutex; large allocations are few).
// When the system refuses a new block, the cache is emptied and the request tried once more before
// std::bad_alloc.
#include <cstddef>
#include <cstdint>
#include <memory>

namespace shardwise {

inline constexpr size_t kCachedFrom = size_t{1} << 20;

// `bytes` of storage (at least one byte); zeroed when `zero`. `huge`: a large block is aligned to
// 2 MiB and offered to transparent huge pages up to its last whole 2 MiB of `bytes` (a buffer
// filled once, as a checkpoint read is; the tail in 4 KiB pages, so no huge page is resident for
// the rounding).
std::shared_ptr<std::byte[]> allocate_storage(size_t bytes, bool zero, bool huge = false);

struct AllocatorStats {
  int64_t in_use_bytes = 0;       // large blocks held by tensors now (the sizes they were served with)
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
// The size a request of `bytes` >= kCachedFrom asks the cache for (whole pages); a block served
// from a larger free range may be up to 64 KiB larger still.
size_t storage_request_size(size_t bytes);

}  // namespace shardwise
