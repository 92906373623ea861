// The parallel reader of the load path gives the bytes a plain copy of the file gives, whatever
// the thread count and piece size: uneven and odd-sized ranges, many small ones, out of file order.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>

#include "ckpt_test_util.h"
#include "shardwise/ckpt/parallel_read.h"
#include "shardwise/ckpt/safetensors_reader.h"
#include "shardwise/ckpt/safetensors_writer.h"
#include "shardwise/core/error.h"

namespace shardwise::ckpt {
namespace {

struct TuningGuard {
  LoadTuning saved = load_tuning();
  ~TuningGuard() { load_tuning() = saved; }
};

std::vector<std::byte> pattern(size_t n) {
  std::vector<std::byte> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>((i * 2654435761u) >> 13);
  return b;
}

TEST(ParallelRead, SameBytesAsTheFileOnUnevenRanges) {
  testing::ScratchDir dir("pread");
  const size_t size = 1'000'003;  // odd
  std::vector<std::byte> file_bytes = pattern(size);
  {
    std::ofstream out(dir.path / "f.bin", std::ios::binary);
    out.write(reinterpret_cast<const char*>(file_bytes.data()), static_cast<std::streamsize>(size));
  }
  // Ranges: 2000 small ones (1-300 bytes) at random offsets, a few large odd ones, an empty one,
  // the last byte; each to its own place in the destination with a gap after it.
  std::mt19937_64 rng(7);
  struct Want {
    uint64_t offset;
    size_t at, n;
  };
  std::vector<Want> wants;
  size_t at = 0;
  auto add = [&](uint64_t offset, size_t n) {
    wants.push_back({offset, at, n});
    at += n + 3;
  };
  for (int i = 0; i < 2000; ++i) {
    size_t n = 1 + rng() % 300;
    add(rng() % (size - n), n);
  }
  add(12345, 123457);
  add(0, 300001);
  add(777, 0);
  add(size - 1, 1);
  add(500000, 499999);
  std::vector<std::byte> expected(at, std::byte{0xEE});
  for (const Want& w : wants) std::memcpy(expected.data() + w.at, file_bytes.data() + w.offset, w.n);

  FileHandle f(dir.path / "f.bin", O_RDONLY);
  for (int threads : {1, 2, 3, 4, 7}) {
    for (size_t piece : {size_t{97}, size_t{4096}, size_t{65537}, size_t{8} << 20}) {
      std::vector<std::byte> got(at, std::byte{0xEE});
      std::vector<ReadRange> ranges;
      for (const Want& w : wants) ranges.push_back({w.offset, got.data() + w.at, w.n});
      pread_ranges(f, ranges, threads, piece);
      ASSERT_EQ(std::memcmp(got.data(), expected.data(), at), 0) << threads << " threads, pieces of " << piece;
    }
  }
}

TEST(ParallelRead, AReaderThreadsErrorReachesTheCaller) {
  testing::ScratchDir dir("pread_err");
  std::vector<std::byte> bytes = pattern(10000);
  {
    std::ofstream out(dir.path / "f.bin", std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), 10000);
  }
  FileHandle f(dir.path / "f.bin", O_RDONLY);
  std::vector<std::byte> got(20000);
  std::vector<ReadRange> ranges = {{0, got.data(), 5000}, {6000, got.data() + 5000, 8000}};  // past the end
  try {
    pread_ranges(f, ranges, 4, 1000);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("file ends before byte"), std::string::npos) << e.what();
  }
}

// read_box under every load tuning (serial, 2 and 4 readers with small pieces, huge pages on and
// off) against the tensor's values computed in memory: whole tensors and column blocks (runs of
// a page or more, read straight into place).
TEST(ParallelRead, ReadBoxMatchesTheValuesUnderEveryTuning) {
  testing::ScratchDir dir("pread_box");
  Tensor a = testing::make_global(DType::F32, Shape{37, 1500}, 3);  // rows of 6000 bytes
  Tensor b = testing::make_global(DType::F64, Shape{5, 3, 701}, 5);
  std::vector<StEntry> entries = {entry_of("a", a), entry_of("b", b)};
  write_safetensors(dir.path / "m.safetensors", entries);
  SafetensorsFile f(dir.path / "m.safetensors");
  TuningGuard guard;
  for (int threads : {1, 2, 4}) {
    for (bool huge : {false, true}) {
      load_tuning() = {threads, size_t{4096} + 3, huge};
      Tensor whole = f.read_box("a", reshard::Box{{0, 0}, Shape{37, 1500}});
      Tensor cols = f.read_box("a", reshard::Box{{0, 399}, Shape{37, 1100}});
      Tensor slab = f.read_box("b", reshard::Box{{0, 1, 0}, Shape{5, 2, 701}});
      for (int64_t r = 0; r < 37; ++r) {
        for (int64_t c = 0; c < 1500; ++c) ASSERT_EQ(whole.at(r * 1500 + c), a.at(r * 1500 + c));
        for (int64_t c = 0; c < 1100; ++c) ASSERT_EQ(cols.at(r * 1100 + c), a.at(r * 1500 + c + 399));
      }
      for (int64_t i = 0; i < 5; ++i) {
        for (int64_t j = 0; j < 2; ++j) {
          for (int64_t k = 0; k < 701; ++k) {
            ASSERT_EQ(slab.at((i * 2 + j) * 701 + k), b.at((i * 3 + j + 1) * 701 + k)) << threads << huge;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace shardwise::ckpt
