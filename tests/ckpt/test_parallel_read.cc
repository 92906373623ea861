// The parallel reader of the load path gives the bytes a plain copy of the file gives, whatever
// the thread count and piece size: uneven and odd-sized ranges, many small ones, out of file order;
// so does the O_DIRECT reader, on a disk that takes direct reads and on tmpfs, which may not.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <random>

#include "ckpt_test_util.h"
#include "shardwise/ckpt/parallel_read.h"
#include "shardwise/ckpt/safetensors_reader.h"
#include "shardwise/ckpt/safetensors_writer.h"
#include "shardwise/core/error.h"
#include "shardwise/tensor/allocator.h"

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

void write_bytes(const fs::path& path, const std::vector<std::byte>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// Drops the file's clean pages from the page cache (the load reads a cached span through it).
void evict(const fs::path& path) {
  FileHandle f(path, O_RDONLY);
  f.sync();
  ::posix_fadvise(f.fd(), 0, 0, POSIX_FADV_DONTNEED);
}

// Whether the file system under `dir` opens files for O_DIRECT (ext4 does; tmpfs may refuse).
bool takes_direct_io(const fs::path& dir) {
  write_bytes(dir / "probe", pattern(kDirectAlign));
  int fd = ::open((dir / "probe").c_str(), O_RDONLY | O_DIRECT);
  if (fd >= 0) ::close(fd);
  return fd >= 0;
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

// The direct reader on the test's scratch directory and on tmpfs: ranges whose destinations keep
// the file offset's residue modulo the alignment (read direct in the middle, buffered at both
// ends), ranges whose residues differ (buffered), ranges inside one block, one at the file's odd
// end; many requests and small pieces. The bytes must be the file's, and where the file system
// takes O_DIRECT the aligned middles must have been read with it.
TEST(ParallelRead, DirectReaderGivesTheFileBytes) {
  const size_t size = 3 * (size_t{1} << 20) + 12345;  // not a whole number of blocks
  std::vector<std::byte> file_bytes = pattern(size);
  testing::ScratchDir scratch("pread_direct");
  std::vector<fs::path> dirs = {scratch.path};
  if (fs::is_directory("/dev/shm")) dirs.push_back(fs::path("/dev/shm") / scratch.path.filename());
  struct RemoveAll {
    fs::path p;
    ~RemoveAll() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } shm_cleanup{dirs.back() == scratch.path ? fs::path() : dirs.back()};
  for (const fs::path& dir : dirs) {
    fs::create_directories(dir);
    write_bytes(dir / "f.bin", file_bytes);
    const bool direct_ok = takes_direct_io(dir);
    // Destination: one block-aligned buffer; each range at a chosen residue with a gap after it.
    struct Want {
      uint64_t offset;
      size_t n, at;
    };
    std::vector<Want> wants;
    size_t at = 0;
    auto add = [&](uint64_t offset, size_t n, bool same_residue) {
      at = (at + kDirectAlign - 1) / kDirectAlign * kDirectAlign + offset % kDirectAlign + (same_residue ? 0 : 8);
      wants.push_back({offset, n, at});
      at += n + 5;
    };
    add(0, size, true);                         // the whole file, its odd tail buffered
    add(8 + 4096 * 3 + 100, 1'000'000, true);   // head, middle, tail
    add(4096 * 5, 4096 * 40, true);             // aligned both ends: all direct
    add(777, 2'000'000, false);                 // residues differ: buffered
    add(8200, 3000, true);                      // inside one block: buffered
    add(size - 5000, 5000, true);               // to the file's end
    add(123, 0, true);
    std::vector<std::byte> expected(at, std::byte{0xEE});
    for (const Want& w : wants) std::memcpy(expected.data() + w.at, file_bytes.data() + w.offset, w.n);
    std::shared_ptr<std::byte[]> buffer = allocate_storage(at, false, true);  // huge-page blocks are 2 MiB aligned
    FileHandle f(dir / "f.bin", O_RDONLY);
    for (int requests : {1, 4, 9}) {
      for (size_t piece : {size_t{4096}, size_t{65536} + 17, size_t{8} << 20}) {
        std::memset(buffer.get(), 0xEE, at);
        std::vector<ReadRange> ranges;
        for (const Want& w : wants) ranges.push_back({w.offset, buffer.get() + w.at, w.n});
        const uint64_t before = direct_read_bytes();
        pread_ranges_direct(f, ranges, requests, piece);
        ASSERT_EQ(std::memcmp(buffer.get(), expected.data(), at), 0) << dir << ", " << requests << " requests, pieces of " << piece;
        // The aligned middles of the same-residue ranges: the whole file's, 1'000'000 - 3996 - ..., and so on.
        uint64_t middles = 0;
        for (const Want& w : wants) {
          const uint64_t lo = (w.offset + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
          const uint64_t hi = (w.offset + w.n) / kDirectAlign * kDirectAlign;
          if ((w.at - w.offset) % kDirectAlign == 0 && hi > lo) middles += hi - lo;
        }
        EXPECT_EQ(direct_read_bytes() - before, direct_ok ? middles : 0) << dir;
      }
    }
    std::cout << dir << ": O_DIRECT " << (direct_ok ? "taken" : "refused") << "\n";
  }
  testing::skip_unless_direct_io(takes_direct_io(scratch.path), scratch.path);
}

TEST(ParallelRead, DirectReaderReportsAShortFile) {
  testing::ScratchDir dir("pread_direct_err");
  write_bytes(dir.path / "f.bin", pattern(3 * kDirectAlign + 10));
  FileHandle f(dir.path / "f.bin", O_RDONLY);
  std::shared_ptr<std::byte[]> buffer = allocate_storage(8 * kDirectAlign, false, true);
  std::vector<ReadRange> ranges = {{0, buffer.get(), 6 * kDirectAlign}};  // past the end
  try {
    pread_ranges_direct(f, ranges, 3, kDirectAlign);
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
      load_tuning().direct = false;
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

// The VmFlags of the mapping holding `p` (/proc/self/smaps), "" when none holds it.
std::string vm_flags_at(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) inside = lo <= at && at < hi;
    else if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

// By default a load's destinations are not offered to transparent huge pages (madvise leaves the
// flag "hg" on the mapping): on the dev VM a fresh huge page cost 2-4x the CPU of 4 KiB pages.
// The values are the tensor's, whole and as a column block, direct reads or not.
TEST(ParallelRead, LoadDestinationsAreNotOfferedToHugePagesByDefault) {
  testing::ScratchDir dir("pread_pages");
  Tensor w = testing::make_global(DType::F32, Shape{1536, 1024}, 7);  // 6 MiB: a huge block if asked
  std::vector<StEntry> entries = {entry_of("w", w)};
  write_safetensors(dir.path / "m.safetensors", entries);
  SafetensorsFile f(dir.path / "m.safetensors");
  TuningGuard guard;
  load_tuning() = LoadTuning{};
  evict(dir.path / "m.safetensors");
  Tensor whole = f.read_box("w", reshard::Box{{0, 0}, Shape{1536, 1024}});
  Tensor cols = f.read_box("w", reshard::Box{{0, 512}, Shape{1536, 512}});
  for (const Tensor* t : {&whole, &cols}) {
    const std::string flags = vm_flags_at(t->raw());
    ASSERT_FALSE(flags.empty());
    EXPECT_EQ((flags + " ").find(" hg "), std::string::npos) << flags;
  }
  for (int64_t r = 0; r < 1536; ++r) {
    for (int64_t c = 0; c < 1024; ++c) ASSERT_EQ(whole.at(r * 1024 + c), w.at(r * 1024 + c));
    for (int64_t c = 0; c < 512; ++c) ASSERT_EQ(cols.at(r * 512 + c), w.at(r * 1024 + c + 512));
  }
}

// read_box with O_DIRECT reads (forced for every run length) against the values computed in
// memory: tensors whose data start off the block alignment in the file (the destination takes the
// same residue), and column blocks whose runs keep it only now and then (the others buffered);
// once the file is in the page cache, no direct reads.
TEST(ParallelRead, ReadBoxMatchesTheValuesWithDirectReads) {
  testing::ScratchDir dir("pread_box_direct");
  Tensor small = testing::make_global(DType::F32, Shape{3}, 1);        // puts "w" 12 bytes off
  Tensor w = testing::make_global(DType::F32, Shape{300, 1500}, 3);     // 1.8 MB, rows of 6000 bytes
  std::vector<StEntry> entries = {entry_of("a_small", small), entry_of("w", w)};
  write_safetensors(dir.path / "m.safetensors", entries);
  SafetensorsFile f(dir.path / "m.safetensors");
  const bool direct_ok = takes_direct_io(dir.path);
  TuningGuard guard;
  for (int requests : {1, 3}) {
    load_tuning() = {2, size_t{1} << 20, true, true, true, requests, size_t{64} << 10, 0};
    evict(dir.path / "m.safetensors");
    const uint64_t before = direct_read_bytes();
    Tensor whole = f.read_box("w", reshard::Box{{0, 0}, Shape{300, 1500}});
    if (direct_ok) {
      EXPECT_GT(direct_read_bytes() - before, w.nbytes() - 2 * kDirectAlign);
      const uint64_t file_offset = f.header().data_start() + f.info("w").begin;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(whole.raw()) % kDirectAlign, file_offset % kDirectAlign);
    }
    Tensor rows = f.read_box("w", reshard::Box{{17, 0}, Shape{200, 1500}});
    Tensor cols = f.read_box("w", reshard::Box{{0, 399}, Shape{300, 1100}});
    Tensor range = f.read_range("w", reshard::Box{{10, 0}, Shape{200, 1500}}, 1234, 250'000);
    for (int64_t r = 0; r < 300; ++r) {
      for (int64_t c = 0; c < 1500; ++c) ASSERT_EQ(whole.at(r * 1500 + c), w.at(r * 1500 + c));
      for (int64_t c = 0; c < 1100; ++c) ASSERT_EQ(cols.at(r * 1100 + c), w.at(r * 1500 + c + 399)) << requests;
    }
    for (int64_t i = 0; i < 200 * 1500; ++i) ASSERT_EQ(rows.at(i), w.at(17 * 1500 + i));
    for (int64_t i = 0; i < 250'000; ++i) ASSERT_EQ(range.at(i), w.at(10 * 1500 + 1234 + i));
  }
  // A file in the page cache (just read whole) is read through it, not from the disk.
  std::ifstream(dir.path / "m.safetensors", std::ios::binary).ignore(std::numeric_limits<std::streamsize>::max());
  const uint64_t before = direct_read_bytes();
  Tensor cached = f.read_box("w", reshard::Box{{0, 0}, Shape{300, 1500}});
  EXPECT_EQ(direct_read_bytes(), before);
  for (int64_t i = 0; i < 300 * 1500; ++i) ASSERT_EQ(cached.at(i), w.at(i));
  testing::skip_unless_direct_io(direct_ok, dir.path);
}

}  // namespace
}  // namespace shardwise::ckpt
