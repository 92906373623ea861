#pragma once
// The save's file writers: a file whose bytes one rank holds (header and every tensor piece) is
// written as one stream, in file order, with O_DIRECT from aligned staging buffers, several writes
// in flight, its digests computed from memory on the way (no read-back); a file several ranks
// write gets each rank's stretches (write_runs: O_DIRECT where asked, the blocks two ranks share
// through the page cache) and each stretch's xxh64 from memory. Where the file system refuses
// O_DIRECT (EINVAL at open or at a write) the same bytes go through the page cache.
#include <cstddef>
#include <cstdint>
#include <span>

#include "shardwise/ckpt/checksum.h"
#include "shardwise/ckpt/file_io.h"

namespace shardwise::ckpt {

// Process-wide tuning of checkpoint saves; BENCHMARKS.md ("Checkpoints") has the measurements
// behind the defaults.
struct SaveTuning {
  // O_DIRECT for the files one rank writes whole and for the long stretches of the files several
  // ranks write (write_runs; off: the page cache for all).
  bool direct = true;
  int direct_requests = 4;                 // writes in flight
  size_t direct_piece = size_t{16} << 20;  // bytes per write (a multiple of 4 KiB)
  // A file several ranks write: a rank's stretch of adjacent bytes this long or longer is written
  // with O_DIRECT and digested by its writer from memory; the shorter ones (column blocks: a run
  // per row) go through the page cache and the owner digests them after the fsync, from memory.
  size_t direct_min_stretch = size_t{1} << 20;
};
SaveTuning& save_tuning();

// `n` bytes from `data` at file offset `offset`.
struct WriteSegment {
  uint64_t offset = 0;
  const std::byte* data = nullptr;
  size_t n = 0;
};

// Creates (or truncates) `path` and writes the segments, which must tile [0, size) in order
// (Error otherwise), with O_DIRECT when `tuning.direct` and the file system takes it, else with
// buffered pwrites. Returns the file's digests, computed from the segments. Does not fsync.
FileDigest write_file_streamed(const fs::path& path, std::span<const WriteSegment> segments, bool with_sha256,
                               const SaveTuning& tuning);

// Writes `runs` (this rank's bytes of a file other ranks write parts of too; sorted by offset, not
// overlapping) into `file`, which the caller has opened for writing and sized, and returns the
// xxh64 of each stretch of adjacent runs (computed from memory). With `tuning.direct`, each stretch
// is written with O_DIRECT in the aligned blocks it covers whole (staging buffers,
// `tuning.direct_requests` writes in flight), its partial first and last blocks through the page
// cache (another writer may write the rest of those blocks; a block is never written both ways);
// everything goes through the page cache where `tuning.direct` is off or the file system refuses
// O_DIRECT.
std::vector<PartDigest> write_runs(FileHandle& file, std::span<const WriteSegment> runs, const SaveTuning& tuning);

// Bytes written with O_DIRECT by this process so far (tests and the bench check the path was taken).
uint64_t direct_write_bytes();

}  // namespace shardwise::ckpt
