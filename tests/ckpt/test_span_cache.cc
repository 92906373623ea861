// The span cache of the load path (span_cache.h): a row-major tensor loaded by column blocks on 4
// rank threads, its spans read once with O_DIRECT and shared, gives each rank the file's own bytes
// of its columns (the file written here byte by byte, not by shardwise's writer), with chunks small
// enough to be evicted and read again mid-load; a chunk whose read fails is an error on every rank
// that needs it, not a hang; and nothing stays mapped after the load.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ckpt_test_util.h"
#include "shardwise/ckpt/parallel_read.h"
#include "shardwise/ckpt/span_cache.h"
#include "shardwise/core/error.h"

namespace shardwise::ckpt {
namespace {

// 33.6 MB: the disk's readahead of the header's page (8 MiB here) leaves most of it uncached.
// Column blocks of 1025 floats: runs of 4100 bytes, off the 4 KiB alignment.
constexpr int64_t kRows = 2048, kCols = 4100, kRanks = 4;

struct TuningGuard {
  LoadTuning saved = load_tuning();
  ~TuningGuard() { load_tuning() = saved; }
};

// "model.safetensors" holding one F32 tensor "w" [kRows, kCols] of arbitrary bytes (every bit
// pattern a float may have, NaNs included: the load must move bytes, not values); returns the
// data section. The header's length puts the data off the 4 KiB alignment.
std::vector<std::byte> write_model(const fs::path& dir) {
  const size_t n = static_cast<size_t>(kRows * kCols) * 4;
  std::vector<std::byte> data(n);
  uint64_t x = 88172645463325252ull;
  for (auto& b : data) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = static_cast<std::byte>(x >> 24);
  }
  const std::string header =
      fmt::format(R"({{"w":{{"dtype":"F32","shape":[{},{}],"data_offsets":[0,{}]}}}})", kRows, kCols, n);
  std::ofstream out(dir / "model.safetensors", std::ios::binary);
  const uint64_t len = header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((len >> (8 * i)) & 0xff));
  out << header;
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(n));
  return data;
}

// `n` bytes of a fixed pattern written to `file`; returns them.
std::vector<std::byte> write_bytes(const fs::path& file, size_t n) {
  std::vector<std::byte> data(n);
  for (size_t i = 0; i < n; ++i) data[i] = static_cast<std::byte>((i * 2654435761u) >> 13);
  std::ofstream(file, std::ios::binary).write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(n));
  return data;
}

// Drops the file's clean pages from the page cache (a cached span is read through it instead).
void evict(const fs::path& path) {
  FileHandle f(path, O_RDONLY);
  f.sync();
  ::posix_fadvise(f.fd(), 0, 0, POSIX_FADV_DONTNEED);
}

bool takes_direct_io(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  if (fd >= 0) ::close(fd);
  return fd >= 0;
}

// Loads "w" as S(1) over kRanks rank threads and checks every rank's block against the file's bytes
// (the caller holds a SpanCacheUse, so the ranks share the cache however their threads start).
void load_and_check(const fs::path& dir, const std::vector<std::byte>& data) {
  const std::vector<LoadSpec> specs = {
      {"w", Shape{kRows, kCols}, DType::F32, {mesh::ProcessMesh(Shape{kRanks}), mesh::parse_dist("S(1)", 1)}}};
  std::vector<Tensor> got(kRanks);
  std::vector<std::thread> ranks;
  for (int64_t p = 0; p < kRanks; ++p) {
    ranks.emplace_back([&, p] { got[static_cast<size_t>(p)] = load_group(dir, "model", specs, p).at("w"); });
  }
  for (auto& t : ranks) t.join();
  const int64_t cols = kCols / kRanks;
  for (int64_t p = 0; p < kRanks; ++p) {
    const Tensor& t = got[static_cast<size_t>(p)];
    ASSERT_EQ(t.shape(), (Shape{kRows, cols}));
    for (int64_t r = 0; r < kRows; ++r) {
      ASSERT_EQ(std::memcmp(t.raw() + r * cols * 4, data.data() + (r * kCols + p * cols) * 4, static_cast<size_t>(cols) * 4), 0)
          << "rank " << p << " row " << r;
    }
  }
}

TEST(SpanCache, ColumnBlocksOnFourThreadsAreTheFilesBytesAndNothingStaysCached) {
  testing::ScratchDir dir("span_cache");
  const std::vector<std::byte> data = write_model(dir.path);
  const fs::path file = dir.path / "model.safetensors";
  const bool direct_ok = takes_direct_io(file);
  TuningGuard guard;
  load_tuning().span_chunk = size_t{1} << 20;  // 33 chunks over the tensor
  const uint64_t mapped0 = span_cache_held_bytes();
  EXPECT_EQ(mapped0, 0u);

  // Room for every chunk: each is read once for the four ranks (the test holds the cache open
  // across the ranks' loads, so a rank finishing early does not free chunks another still needs).
  load_tuning().span_cache_bytes = size_t{64} << 20;
  evict(file);
  uint64_t before = span_cache_read_bytes();
  {
    SpanCacheUse use;
    load_and_check(dir.path, data);
    if (direct_ok) {
      EXPECT_GT(span_cache_held_bytes(), 0u);
    }
  }
  if (direct_ok) {
    const uint64_t read = span_cache_read_bytes() - before;
    EXPECT_GE(read, data.size());
    EXPECT_LE(read, fs::file_size(file));  // once, not once per rank
  }
  EXPECT_EQ(span_cache_held_bytes(), 0u);

  // Room for 4 chunks: chunks are evicted while other ranks may still need them (then read
  // again); the bytes stay right.
  load_tuning().span_cache_bytes = size_t{4} << 20;
  evict(file);
  before = span_cache_read_bytes();
  {
    SpanCacheUse use;
    load_and_check(dir.path, data);
  }
  if (direct_ok) {
    EXPECT_GE(span_cache_read_bytes() - before, data.size());
  }
  EXPECT_EQ(span_cache_held_bytes(), 0u);

  // One rank loading alone in its process (one rank per process, as under MPI) keeps the page
  // cache, which the processes of a node share.
  load_tuning().span_cache_bytes = size_t{64} << 20;
  evict(file);
  before = span_cache_read_bytes();
  const std::vector<LoadSpec> specs = {
      {"w", Shape{kRows, kCols}, DType::F32, {mesh::ProcessMesh(Shape{kRanks}), mesh::parse_dist("S(1)", 1)}}};
  const Tensor alone = load_group(dir.path, "model", specs, 2).at("w");
  EXPECT_EQ(span_cache_read_bytes(), before);
  ASSERT_EQ(std::memcmp(alone.raw() + 4100, data.data() + (kCols + 2 * 1025) * 4, 4100), 0);

  // No cache (0 bytes): the page-cache path, same bytes, nothing read into chunks.
  load_tuning().span_cache_bytes = 0;
  evict(file);
  before = span_cache_read_bytes();
  load_and_check(dir.path, data);
  EXPECT_EQ(span_cache_read_bytes(), before);
  testing::skip_unless_direct_io(direct_ok, dir.path);
}

// One rank much slower than the others (here it reads its column one chunk per call, sleeping
// between calls; on 2 cores a rank thread can lose its core for as long): the others run at most
// the cache's room ahead of it, so no chunk it still needs is evicted and every chunk of the file
// is read from the disk exactly once. Without that bound the three fast ranks race through the
// file, the cache (4 chunks) keeps only their latest chunks, and the slow rank reads the file again.
TEST(SpanCache, AFastRankWaitsForASlowOneSoEachChunkIsReadOnce) {
  testing::ScratchDir dir("span_cache_slow");
  const fs::path file = dir.path / "spans.bin";
  constexpr size_t kChunk = size_t{1} << 20, kFile = 24 * kChunk, kRun = 4096, kStride = kRanks * kRun;
  const std::vector<std::byte> data = write_bytes(file, kFile);
  if (!takes_direct_io(file)) GTEST_SKIP() << "no O_DIRECT under " << dir.path;
  TuningGuard guard;
  load_tuning().span_chunk = kChunk;
  load_tuning().span_cache_bytes = 4 * kChunk;  // room for 4 chunks
  // The slow rank sleeps 5 ms away from the cache between its calls: on a loaded machine that sleep
  // can last past the 20 ms after which an away reader is not waited for, and the fast ranks would
  // rightly go on and read chunks twice. The test is about the waiting, not the scheduler: bounds
  // no load reaches.
  load_tuning().span_away_wait_ms = 60'000;
  load_tuning().span_lead_wait_ms = 120'000;
  evict(file);
  const uint64_t before = span_cache_read_bytes();
  const uint64_t timeouts_before = span_cache_lead_timeouts();

  std::vector<std::vector<std::byte>> dst(kRanks, std::vector<std::byte>(kFile / kRanks));
  auto runs_of = [&](size_t p, size_t from, size_t to) {  // rank p's 4 KiB of every 16 KiB in [from, to)
    std::vector<ReadRange> runs;
    for (size_t at = from; at < to; at += kStride) runs.push_back({at + p * kRun, dst[p].data() + at / kRanks, kRun});
    return runs;
  };
  std::atomic<bool> slow_joined{false};
  std::vector<std::thread> ranks;
  ranks.emplace_back([&] {  // rank 3, slow: one chunk per call; its use spans the calls, as load_group's does
    SpanCacheUse use;
    for (size_t c = 0; c < kFile / kChunk; ++c) {
      read_through_span_cache(file, kFile, runs_of(3, c * kChunk, (c + 1) * kChunk), 4, size_t{256} << 10);
      slow_joined = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  while (!slow_joined) std::this_thread::yield();
  for (size_t p = 0; p < 3; ++p) {
    ranks.emplace_back([&, p] { read_through_span_cache(file, kFile, runs_of(p, 0, kFile), 4, size_t{256} << 10); });
  }
  for (auto& t : ranks) t.join();

  EXPECT_EQ(span_cache_read_bytes() - before, kFile);  // each chunk once
  EXPECT_EQ(span_cache_lead_timeouts() - timeouts_before, 0u);
  for (size_t p = 0; p < static_cast<size_t>(kRanks); ++p) {
    for (size_t at = 0; at < kFile; at += kStride) {
      ASSERT_EQ(std::memcmp(dst[p].data() + at / kRanks, data.data() + at + p * kRun, kRun), 0) << "rank " << p << " at " << at;
    }
  }
  EXPECT_EQ(span_cache_held_bytes(), 0u);
}

// A rank that stays out of the cache (here: between two of its reads until the other rank is done,
// as a rank reading a large tensor another way would) is not waited for: the other rank reads the
// whole file without once waiting out the bound for it (it would wait the lead bound, 2 s, per window
// otherwise, each counted by span_cache_lead_timeouts).
TEST(SpanCache, ARankAwayFromTheCacheIsNotWaitedFor) {
  testing::ScratchDir dir("span_cache_away");
  const fs::path file = dir.path / "spans.bin";
  constexpr size_t kChunk = size_t{1} << 20, kFile = 24 * kChunk, kRun = 4096, kStride = 2 * kRun;
  const std::vector<std::byte> data = write_bytes(file, kFile);
  if (!takes_direct_io(file)) GTEST_SKIP() << "no O_DIRECT under " << dir.path;
  TuningGuard guard;
  load_tuning().span_chunk = kChunk;
  load_tuning().span_cache_bytes = 4 * kChunk;  // room for 4 chunks
  std::vector<std::vector<std::byte>> dst(2, std::vector<std::byte>(kFile / 2));
  auto runs_of = [&](size_t p, size_t from, size_t to) {
    std::vector<ReadRange> runs;
    for (size_t at = from; at < to; at += kStride) runs.push_back({at + p * kRun, dst[p].data() + at / 2, kRun});
    return runs;
  };
  std::mutex m;
  std::condition_variable cv;
  bool joined = false, fast_done = false;
  const uint64_t timeouts = span_cache_lead_timeouts();
  std::thread away([&] {
    SpanCacheUse use;  // inside its load all along, as in load_group
    read_through_span_cache(file, kFile, runs_of(1, 0, kChunk), 4, size_t{256} << 10);
    std::unique_lock lock(m);
    joined = true;
    cv.notify_all();
    cv.wait(lock, [&] { return fast_done; });
    lock.unlock();
    read_through_span_cache(file, kFile, runs_of(1, kChunk, kFile), 4, size_t{256} << 10);
  });
  {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return joined; });
  }
  read_through_span_cache(file, kFile, runs_of(0, 0, kFile), 4, size_t{256} << 10);
  {
    std::lock_guard lock(m);
    fast_done = true;
  }
  cv.notify_all();
  away.join();
  EXPECT_EQ(span_cache_lead_timeouts(), timeouts) << "the rank reading the file waited for the one away from the cache";
  for (size_t p = 0; p < 2; ++p) {
    for (size_t at = 0; at < kFile; at += kStride) {
      ASSERT_EQ(std::memcmp(dst[p].data() + at / 2, data.data() + at + p * kRun, kRun), 0) << "rank " << p << " at " << at;
    }
  }
  EXPECT_EQ(span_cache_held_bytes(), 0u);
}

// A chunk whose read fails (here: past the end of a file said to be longer) fails on every rank
// that needs it, the one reading it and the ones waiting for it, instead of leaving them waiting;
// nothing stays cached.
TEST(SpanCache, AFailedChunkIsAnErrorOnEveryRankThatNeedsIt) {
  testing::ScratchDir dir("span_cache_error");
  const fs::path file = dir.path / "short.bin";
  {
    std::vector<char> bytes(size_t{3} << 20, 'x');
    std::ofstream(file, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  if (!takes_direct_io(file)) GTEST_SKIP() << "no O_DIRECT under " << dir.path;
  TuningGuard guard;
  load_tuning().span_chunk = size_t{1} << 20;
  const uint64_t claimed_size = uint64_t{5} << 20;  // 2 MiB more than the file holds
  std::vector<std::vector<std::byte>> dst(kRanks, std::vector<std::byte>(size_t{1} << 20));
  std::vector<std::string> errors(kRanks);
  {
    SpanCacheUse use;
    std::vector<std::thread> ranks;
    for (size_t p = 0; p < static_cast<size_t>(kRanks); ++p) {
      ranks.emplace_back([&, p] {
        std::vector<ReadRange> runs;  // 4 KiB of every 20 KiB over the 5 MiB, this rank's column
        for (uint64_t at = p * 4096; at + 4096 <= claimed_size; at += 5 * 4096) {
          runs.push_back({at, dst[p].data() + runs.size() * 4096 % dst[p].size(), 4096});
        }
        try {
          read_through_span_cache(file, claimed_size, runs, 4, size_t{256} << 10);
        } catch (const Error& e) {
          errors[p] = e.what();
        }
      });
    }
    for (auto& t : ranks) t.join();
  }
  for (size_t p = 0; p < static_cast<size_t>(kRanks); ++p) {
    EXPECT_NE(errors[p].find("short.bin"), std::string::npos) << "rank " << p << ": '" << errors[p] << "'";
  }
  EXPECT_EQ(span_cache_held_bytes(), 0u);
}

}  // namespace
}  // namespace shardwise::ckpt
