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

// Reads every range of `file` (sorted by offset, as a box's runs are) by reading the whole span
// they cover through the page cache, in pieces of at most `piece` bytes taken in file order by up
// to `threads` threads, each piece one scatter read (preadv): the ranges' parts straight into
// place, the gaps between them into one scratch buffer. For many short runs spread over a span (a
// column block of a row-major tensor): a pread per run reads a few pages at a time (its
// neighbours' gaps defeat the kernel's read-ahead, so each waits for a small read of its own),
// where reads of megabytes keep the disk streaming; nothing is copied twice; the pages stay in the
// page cache, which other processes loading other columns of the same rows read from; and no
// buffer larger than the longest gap is held, whatever the span.
void pread_span_pieces(const FileHandle& file, std::span<const ReadRange> ranges, int threads, size_t piece);
// Bytes read by pread_span_pieces in this process so far, gaps included (tests check the path was
// taken).
uint64_t span_piece_read_bytes();

// The alignment of O_DIRECT reads (file offsets, lengths and addresses): a page, a multiple of
// every disk's logical block size up to 4 KiB.
inline constexpr size_t kDirectAlign = 4096;

// Reads every range of `file` (open as `buffered`) with O_DIRECT where it can, for the bytes to go
// from the disk straight into place with neither a page-cache copy nor page-cache pages to
// allocate: a range's part from its first to its last multiple of kDirectAlign in the file, when
// its destination address has the same offset modulo kDirectAlign (allocate the destination with
// that lead: Tensor::uninitialized_at), in pieces of at most `piece` bytes taken in file order by
// `requests` threads (that many requests in flight). Heads, tails, ranges whose residues differ, and
// everything on a file system that refuses O_DIRECT (EINVAL) go through `buffered`. Errors as
// pread_ranges.
void pread_ranges_direct(const FileHandle& buffered, std::span<const ReadRange> ranges, int requests, size_t piece);
// Bytes read with O_DIRECT by this process so far (tests and the bench check the path was taken).
uint64_t direct_read_bytes();

// Process-wide tuning of checkpoint loads (SafetensorsFile::read_box): O_DIRECT or buffered reads,
// reader threads per box read (buffered: each takes byte-balanced pieces of at most piece_bytes)
// and whether destination tensors are offered to transparent huge pages. BENCHMARKS.md
// ("Checkpoints") has the measurements behind the defaults.
struct LoadTuning {
  int reader_threads = 2;
  size_t piece_bytes = size_t{8} << 20;
  // Off: where the guest hands free 2 MiB blocks back to its host (virtio-balloon free page
  // reporting, page_reporting_order 9, as on the dev VM), a fresh huge page is backed again on its
  // first touch, and clearing it cost 2-4x the CPU of the same bytes in 4 KiB pages (BENCHMARKS.md,
  // "load destinations in 4 KiB pages", 2026-11-29).
  bool huge_pages = false;
  bool will_need = true;  // posix_fadvise(WILLNEED) over the box's file span before reading it (not direct)
  // O_DIRECT reads (pread_ranges_direct) for boxes whose runs average at least direct_min_run
  // bytes (whole tensors, row blocks); shorter runs (column blocks) share the page cache.
  bool direct = true;
  int direct_requests = 8;  // 64 MiB in flight, as dd bs=64M keeps
  size_t direct_piece = size_t{8} << 20;
  size_t direct_min_run = size_t{1} << 20;
  // Boxes of shorter runs (column blocks) spread over a span of the file (at least 1/16 of it
  // needed) go through the span cache (span_cache.h) while two loads or more run in the process: chunks of
  // span_chunk bytes read once with O_DIRECT and shared by the ranks of the process, at most
  // span_cache_bytes of them held (0: no cache, the page cache instead).
  size_t span_cache_bytes = size_t{64} << 20;
  size_t span_chunk = size_t{8} << 20;
  bool span_read_ahead = true;
  // A reader ahead of the slowest by more than its lead waits at most span_lead_wait_ms for it; a
  // reader out of the cache for span_away_wait_ms (between two spans) is not waited for.
  int span_lead_wait_ms = 2000;
  int span_away_wait_ms = 20;  // a rank reading a span's last chunks also reads the next window's
  // A column block's span read through the page cache in pieces of piece_bytes (pread_span_pieces)
  // by reader_threads threads, where the span cache is not used; off: a pread per run.
  bool span_pieces = true;
};
LoadTuning& load_tuning();

}  // namespace shardwise::ckpt
