#pragma once
// The save's file writer: a file whose bytes one rank holds (header and every tensor piece) is
// written as one stream, in file order, with O_DIRECT from aligned staging buffers, several writes
// in flight, its digests computed from memory on the way (no read-back). Where the file system
// refuses O_DIRECT (EINVAL at open or at a write) the same bytes go through the page cache.
#include <cstddef>
#include <cstdint>
#include <span>

#include "shardwise/ckpt/checksum.h"
#include "shardwise/ckpt/file_io.h"

namespace shardwise::ckpt {

// Process-wide tuning of checkpoint saves; BENCHMARKS.md ("Checkpoints") has the measurements
// behind the defaults.
struct SaveTuning {
  // O_DIRECT for the files one rank writes whole (the others: buffered pwrites of each rank's
  // pieces, the owner fsyncs and digests the file from the page cache).
  bool direct = true;
  int direct_requests = 4;                 // writes in flight
  size_t direct_piece = size_t{16} << 20;  // bytes per write (a multiple of 4 KiB)
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

// Bytes written with O_DIRECT by this process so far (tests and the bench check the path was taken).
uint64_t direct_write_bytes();

}  // namespace shardwise::ckpt
