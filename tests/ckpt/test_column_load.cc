// Column blocks loaded by a process alone (no span cache shared with other rank threads): the span
// is read through the page cache in pieces (pread_span_pieces), each a scatter read into place. The
// reader gives the file's bytes whatever the piece size and thread count (pieces cutting runs in
// two, a piece larger than the span); and a checkpoint saved Shard(0) on 4 ranks (uneven and empty
// row blocks) loads as Shard(1) on 3 and 4 processes (uneven and empty column blocks) with every
// value exact against the whole tensor, cut here by hand, the files in the page cache or not.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <vector>

#include "ckpt_test_util.h"
#include "shardwise/ckpt/group_reader.h"
#include "shardwise/ckpt/parallel_read.h"
#include "shardwise/comm/local.h"

namespace shardwise::ckpt {
namespace {

using namespace testing;

struct TuningGuard {
  LoadTuning saved = load_tuning();
  ~TuningGuard() { load_tuning() = saved; }
};

void evict_dir(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    FileHandle f(e.path(), O_RDONLY);
    ::posix_fadvise(f.fd(), 0, 0, POSIX_FADV_DONTNEED);
  }
}

TEST(ColumnLoad, SpanPiecesGiveTheFilesBytesForEveryPieceSizeAndThreadCount) {
  ScratchDir dir("pieces");
  std::vector<std::byte> bytes(100'003);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>((i * 2654435761u) >> 13);
  const fs::path path = dir.path / "f";
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  FileHandle file(path, O_RDONLY);
  // Runs of 1 to 700 bytes with gaps between them, as a column block's rows are, from byte 17 on.
  std::vector<std::pair<uint64_t, size_t>> runs;
  for (uint64_t at = 17, k = 0; at < bytes.size(); ++k) {
    const size_t n = std::min<size_t>(1 + (k * 37) % 700, bytes.size() - at);
    runs.emplace_back(at, n);
    at += n + (k % 3) * 211;
  }
  uint64_t needed = 0;
  for (const auto& [at, n] : runs) needed += n;
  for (size_t piece : {size_t{1}, size_t{4096}, size_t{4097}, size_t{65536}, size_t{1} << 20}) {
    for (int threads : {1, 3}) {
      std::vector<std::byte> out(bytes.size(), std::byte{0xee});
      std::vector<ReadRange> ranges;
      for (const auto& [at, n] : runs) ranges.push_back({at, out.data() + at, n});
      const uint64_t before = span_piece_read_bytes();
      pread_span_pieces(file, ranges, threads, piece);
      const uint64_t read = span_piece_read_bytes() - before;  // the runs and some of the gaps
      EXPECT_GE(read, needed) << piece;
      EXPECT_LE(read, runs.back().first + runs.back().second - 17) << piece;
      size_t r = 0;
      for (size_t i = 0; i < bytes.size(); ++i) {
        while (r < runs.size() && runs[r].first + runs[r].second <= i) ++r;
        const bool inside = r < runs.size() && runs[r].first <= i;
        ASSERT_EQ(out[i], inside ? bytes[i] : std::byte{0xee}) << "piece " << piece << " threads " << threads << " byte " << i;
      }
    }
  }
}

// torch.chunk's cut of `n` into `parts`: blocks of ceil(n / parts), the last ones short or empty.
std::pair<int64_t, int64_t> chunk(int64_t n, int64_t parts, int64_t i) {
  const int64_t size = (n + parts - 1) / parts;
  return {std::min(n, i * size), std::min(n, (i + 1) * size)};
}

// Columns [c0, c1) of the 2-d tensor `whole`, copied element by element.
Tensor columns(const Tensor& whole, int64_t c0, int64_t c1) {
  const int64_t rows = whole.shape()[0], cols = whole.shape()[1];
  const size_t es = dtype_size(whole.dtype());
  Tensor out = Tensor::uninitialized(whole.dtype(), Shape{rows, c1 - c0});
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = c0; c < c1; ++c) {
      std::memcpy(out.raw() + static_cast<size_t>(r * (c1 - c0) + c - c0) * es,
                  whole.raw() + static_cast<size_t>(r * cols + c) * es, es);
    }
  }
  return out;
}

TEST(ColumnLoad, Shard1FromShard0FilesWithUnevenAndEmptyShardsIsExact) {
  // Rows 13, 3 and 2 over 4 save ranks: 4,4,4,1 / 1,1,1,0 / 1,1,0,0. Columns over 3 and 4 load
  // processes: 1500 -> 500 each (runs of 2000 bytes) and 375; 5 -> 2,2,1 and 2,2,1,0; 2 -> 1,1,0 and
  // 1,1,0,0.
  std::vector<GlobalTensor> model = {{"model", "a", make_global(DType::F32, Shape{13, 1500}, 1)},
                                     {"model", "b", make_global(DType::BF16, Shape{3, 5}, 2)},
                                     {"model", "c", make_global(DType::F64, Shape{2, 2}, 3)},
                                     {"model", "d", make_global(DType::I32, Shape{13, 5}, 4)}};
  ScratchDir scratch("colload");
  const Topology fsdp{"fsdp4", "fsdp=4", {{"*", "S(0)"}}};
  comm::LocalWorld::run(4, [&](comm::Communicator& c) { save_checkpoint(c, scratch.path, content_for(model, fsdp, c.rank(), 1)); });
  const fs::path dir = scratch.path / "checkpoint-1";
  TuningGuard guard;
  for (int64_t procs : {3, 4}) {
    for (size_t piece : {size_t{4097}, size_t{8} << 20}) {
      load_tuning().piece_bytes = piece;
      for (int64_t p = 0; p < procs; ++p) {  // one process at a time, as processes of their own load
        evict_dir(dir);
        std::vector<LoadSpec> specs;
        const reshard::Layout cols{mesh::ProcessMesh(Shape{procs}), mesh::parse_dist("S(1)", 1)};
        for (const auto& t : model) specs.push_back({t.name, t.value.shape(), t.value.dtype(), cols});
        const uint64_t before = span_piece_read_bytes();
        auto got = load_group(dir, "model", specs, p);
        for (const auto& t : model) {
          const auto [c0, c1] = chunk(t.value.shape()[1], procs, p);
          EXPECT_TRUE(bit_equal(got.at(t.name), columns(t.value, c0, c1)))
              << t.name << " on process " << p << " of " << procs << ", pieces of " << piece;
        }
        const auto [a0, a1] = chunk(1500, procs, p);
        EXPECT_GE(span_piece_read_bytes() - before, static_cast<uint64_t>(13 * (a1 - a0) * 4)) << "a read in pieces";
      }
    }
  }
}

}  // namespace
}  // namespace shardwise::ckpt
