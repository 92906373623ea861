#include "shardwise/ckpt/parallel_read.h"

#include <algorithm>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace shardwise::ckpt {

LoadTuning& load_tuning() {
  static LoadTuning tuning;
  return tuning;
}

void pread_ranges(const FileHandle& file, std::span<const ReadRange> ranges, int threads, size_t piece) {
  piece = std::max<size_t>(piece, 1);
  uint64_t total = 0;
  for (const ReadRange& r : ranges) total += r.n;
  if (threads <= 1 || total <= piece) {
    for (const ReadRange& r : ranges) {
      if (r.n) file.pread_all({r.dst, r.n}, r.offset);
    }
    return;
  }
  // Pieces in file order; piece i starting at byte `at` of the plan goes to share at * k / total.
  const auto k = static_cast<uint64_t>(std::min<uint64_t>(static_cast<uint64_t>(threads), (total + piece - 1) / piece));
  std::vector<std::vector<ReadRange>> shares(k);
  uint64_t at = 0;
  for (const ReadRange& r : ranges) {
    for (size_t done = 0; done < r.n;) {
      size_t n = std::min(piece, r.n - done);
      shares[std::min(k - 1, at * k / total)].push_back({r.offset + done, r.dst + done, n});
      done += n;
      at += n;
    }
  }
  std::exception_ptr error;
  std::mutex error_mutex;
  auto read_share = [&](const std::vector<ReadRange>& share) {
    try {
      for (const ReadRange& r : share) file.pread_all({r.dst, r.n}, r.offset);
    } catch (...) {
      std::lock_guard lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  };
  std::vector<std::thread> readers;
  readers.reserve(k - 1);
  for (uint64_t t = 1; t < k; ++t) readers.emplace_back(read_share, std::cref(shares[t]));
  read_share(shares[0]);  // the caller reads the first share
  for (auto& t : readers) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace shardwise::ckpt
