#pragma once
// A process-wide, size-bounded cache of file spans read once with O_DIRECT and shared by the ranks
// of the process (threads) that load boxes out of the same stored tensor: a column block of a
// row-major tensor is a short run per row, so every rank of a tp group needs bytes of every row
// span. Without the cache each rank reads the span through the page cache (fault-in, a copy per
// rank); with it the first rank to need a chunk of the file reads it straight from the disk into
// an aligned buffer (several requests in flight, as pread_ranges_direct), and the others wait for
// that buffer and copy their columns out.
//
// The file is cut into chunks of LoadTuning::span_chunk bytes at fixed file offsets, keyed by
// (file identity, chunk index). Entries are evicted least recently used once the cache holds more
// than LoadTuning::span_cache_bytes, those every rank has copied from first (an entry still being
// copied from is kept alive by its users); a rank running more than the cache ahead of the slowest
// rank reading through the cache waits for it rather than evict chunks that one still needs,
// and everything is freed (buffers unmapped) when the last SpanCacheUse of the process ends:
// nothing stays allocated after a load.
#include <cstdint>
#include <span>

#include "shardwise/ckpt/file_io.h"
#include "shardwise/ckpt/parallel_read.h"

namespace shardwise::ckpt {

// load_group holds one for its duration; the last one to end frees every entry and buffer.
class SpanCacheUse {
 public:
  SpanCacheUse();
  ~SpanCacheUse();
  SpanCacheUse(const SpanCacheUse&) = delete;
  SpanCacheUse& operator=(const SpanCacheUse&) = delete;
};

// Whether two or more SpanCacheUses are alive: rank threads of this process loading at once, whose
// boxes read_box/read_range then send through the cache. A process loading alone (one rank per
// process, as under MPI) keeps the page cache, which the processes of a node share: each would
// otherwise read every span from the disk itself.
bool span_cache_shared();

// Fills every range (`file_size` bytes in the file at `path`) from cached chunks, reading the
// chunks not cached yet with O_DIRECT (`requests` in flight, pieces of at most `piece` bytes).
// Returns false, having read nothing, when the file cannot be opened for O_DIRECT (the caller
// reads another way). I/O errors are rethrown on every rank waiting for the chunk.
bool read_through_span_cache(const fs::path& path, uint64_t file_size, std::span<const ReadRange> ranges,
                             int requests, size_t piece);

// Bytes of the chunks held now (0 after a load), and read into the cache by this process so far
// (tests and the bench check the path was taken and each chunk read once).
uint64_t span_cache_held_bytes();
uint64_t span_cache_read_bytes();
// Times a reader waited the whole bound (LoadTuning::span_lead_wait_ms, 2 s) for a slower one and went on without it:
// a reader that never comes (tests check one away from the cache is not waited for at all).
uint64_t span_cache_lead_timeouts();

}  // namespace shardwise::ckpt
