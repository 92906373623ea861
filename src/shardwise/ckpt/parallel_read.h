#pragma once
// Parallel preads of the load path: a load plan's byte ranges (one per contiguous run of a box)
// read by a few reader threads over one file descriptor. Each thread takes a contiguous share of
// the ranges in file order (cut into pieces of at most `piece` bytes, balanced by bytes), so every
// thread reads sequentially and the kernel's fault-in and page clearing of the destination pages
// is spread over the threads too.
#include <cstddef>
#include <cstdint>
#include <span>

#include "shardwise/ckpt/file_io.h"

namespace shardwise::ckpt {

// `n` bytes at file `offset` into `dst`.
struct ReadRange {
  uint64_t offset = 0;
  std::byte* dst = nullptr;
  size_t n = 0;
};

// Reads every range of `file` with up to `threads` threads (1: serially on the caller; also serial
// when the ranges hold no more than one piece). Errors (short file, I/O error) from any thread are
// rethrown on the caller after all threads finished.
void pread_ranges(const FileHandle& file, std::span<const ReadRange> ranges, int threads, size_t piece = size_t{8} << 20);

// Process-wide tuning of checkpoint loads (SafetensorsFile::read_box): reader threads per box read
// (each takes byte-balanced pieces of at most piece_bytes) and whether destination tensors are
// offered to transparent huge pages. BENCHMARKS.md
// ("Checkpoints") has the measurements behind the defaults.
struct LoadTuning {
  int reader_threads = 2;
  size_t piece_bytes = size_t{8} << 20;
  bool huge_pages = true;
  bool will_need = true;  // posix_fadvise(WILLNEED) over the box's file span before reading it
};
LoadTuning& load_tuning();

}  // namespace shardwise::ckpt
