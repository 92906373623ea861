// The save's streamed file writer gives the bytes of the plain concatenation of its segments and
// their digests, with O_DIRECT and through the page cache, on the test's disk, tmpfs and ramfs, for
// pieces of one block or many, an unaligned last block and unaligned sources; a one-rank save
// writes, on both paths, the file the in-memory serializer gives, and the same files as a save on
// tp=2 (whose files several ranks write: write_runs, O_DIRECT for the blocks one rank covers whole,
// the digests read back); several writers of one file sharing blocks give its bytes.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <thread>

#include "ckpt_test_util.h"
#include "shardwise/ckpt/checksum.h"
#include "shardwise/ckpt/direct_write.h"
#include "shardwise/ckpt/manifest.h"
#include "shardwise/ckpt/parallel_read.h"
#include "shardwise/ckpt/safetensors_writer.h"
#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"

namespace shardwise::ckpt {
namespace {

struct SaveTuningGuard {
  SaveTuning saved = save_tuning();
  ~SaveTuningGuard() { save_tuning() = saved; }
};

std::vector<std::byte> pattern(size_t n, unsigned seed) {
  std::vector<std::byte> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>(((i + seed) * 2654435761u) >> 13);
  return b;
}

std::vector<std::byte> read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> b(c.size());
  if (!c.empty()) std::memcpy(b.data(), c.data(), c.size());
  return b;
}

// Whether the file system under `dir` opens files for O_DIRECT writes.
bool takes_direct_io(const fs::path& dir) {
  int fd = ::open((dir / "probe").c_str(), O_WRONLY | O_CREAT | O_DIRECT, 0644);
  if (fd >= 0) ::close(fd);
  fs::remove(dir / "probe");
  return fd >= 0;
}

// The test's scratch directory, a directory on tmpfs (/dev/shm; tmpfs takes O_DIRECT since Linux
// 6.6) and, where this process may mount one, a ramfs, which refuses O_DIRECT (EINVAL): the
// fallback. All removed at the end.
struct TestDirs {
  testing::ScratchDir scratch{"save_direct"};
  std::vector<fs::path> dirs;
  fs::path shm, ramfs;
  TestDirs() {
    dirs.push_back(scratch.path);
    if (fs::is_directory("/dev/shm")) {
      shm = fs::path("/dev/shm") / scratch.path.filename();
      fs::create_directories(shm);
      dirs.push_back(shm);
    }
    fs::create_directories(scratch.path / "ramfs");
    if (std::system(("mount -t ramfs ramfs " + (scratch.path / "ramfs").string() + " 2>/dev/null").c_str()) == 0) {
      ramfs = scratch.path / "ramfs";
      dirs.push_back(ramfs);
    } else {
      std::cout << "cannot mount a ramfs here: the refused-O_DIRECT path is not exercised\n";
    }
  }
  ~TestDirs() {
    std::error_code ec;
    if (!shm.empty()) fs::remove_all(shm, ec);
    if (!ramfs.empty()) (void)std::system(("umount " + ramfs.string()).c_str());
  }
};

TEST(StreamedWrite, SameBytesAndDigestsAsTheConcatenationOnBothPaths) {
  TestDirs two;
  // A header-like first segment, then segments of odd sizes from unaligned places in a source.
  const std::vector<std::byte> source = pattern(200'000, 3);
  const std::vector<std::pair<size_t, size_t>> cuts = {{7, 1234}, {5000, 5000}, {1, 1}, {4096, 4096},
                                                      {77, 3 * 4096 + 17}, {9, 0}, {100'001, 70'000}};
  std::vector<WriteSegment> segs;
  std::vector<std::byte> expected;
  for (const auto& [from, n] : cuts) {
    segs.push_back({expected.size(), source.data() + from, n});
    expected.insert(expected.end(), source.begin() + static_cast<std::ptrdiff_t>(from),
                    source.begin() + static_cast<std::ptrdiff_t>(from + n));
  }
  const uint64_t padded = (expected.size() + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
  for (const fs::path& dir : two.dirs) {
    const bool direct_ok = takes_direct_io(dir);
    for (bool direct : {false, true}) {
      for (size_t piece : {kDirectAlign, 3 * kDirectAlign, size_t{1} << 20}) {
        for (int requests : {1, 3}) {
          SaveTuning tuning{direct, requests, piece};
          const fs::path path = dir / fmt::format("f_{}_{}_{}", direct, piece, requests);
          const uint64_t before = direct_write_bytes();
          FileDigest d = write_file_streamed(path, segs, true, tuning);
          const uint64_t direct_bytes = direct_write_bytes() - before;
          SCOPED_TRACE(path.string());
          EXPECT_EQ(read_all(path), expected);
          EXPECT_EQ(d.size, expected.size());
          EXPECT_EQ(d.xxh64, xxh64_hex(expected));
          EXPECT_EQ(d.sha256, sha256_hex(expected));
          EXPECT_EQ(direct_bytes, direct && direct_ok ? padded : 0);
        }
      }
    }
    std::cout << dir << ": O_DIRECT " << (direct_ok ? "taken" : "refused") << "\n";
    if (dir == two.ramfs) {
      EXPECT_FALSE(direct_ok);
    }
    // An empty file, and one under a block (all of it the padded last block).
    for (size_t n : {size_t{0}, size_t{100}}) {
      std::vector<WriteSegment> small = {{0, source.data() + 3, n}};
      FileDigest d = write_file_streamed(dir / "small", small, false, SaveTuning{});
      EXPECT_EQ(read_all(dir / "small"), std::vector<std::byte>(source.begin() + 3, source.begin() + 3 + static_cast<std::ptrdiff_t>(n)));
      EXPECT_EQ(d.xxh64, xxh64_hex({source.data() + 3, n}));
      EXPECT_TRUE(d.sha256.empty());
    }
  }
  testing::skip_unless_direct_io(takes_direct_io(two.scratch.path), two.scratch.path);
}

TEST(StreamedWrite, RefusesSegmentsThatDoNotTileTheFile) {
  testing::ScratchDir dir("save_direct_gap");
  const std::vector<std::byte> source = pattern(100, 1);
  std::vector<WriteSegment> segs = {{0, source.data(), 10}, {11, source.data() + 10, 5}};
  try {
    write_file_streamed(dir.path / "f", segs, false, SaveTuning{});
    FAIL() << "a gap was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a segment at byte 11 where byte 10 was expected"), std::string::npos) << e.what();
  }
}

// Three writers (threads) write the runs of one file, their boundaries inside blocks they share,
// one writer's part broken by short runs of another (a column block's shape), each stretch made of
// several runs from unaligned places in memory: on both paths the file is the bytes, O_DIRECT
// writes exactly the blocks one writer covers whole, and the writers' part digests tile the file,
// one per stretch, each the xxh64 of the file's bytes there.
TEST(WriteRuns, WritersSharingBlocksGiveTheBytesAndOneDigestPerStretch) {
  TestDirs two;
  constexpr size_t kSize = 150'001;
  const std::vector<std::byte> source = pattern(kSize + 13, 5);
  const std::vector<std::byte> expected(source.begin() + 13, source.end());  // file byte x = source[x + 13]
  auto writer_of = [](size_t x) {
    if (x < 50'003) return (x >= 20'000 && x % 20'000 < 100) ? 2 : 0;
    return x < 100'777 ? 1 : 2;
  };
  std::vector<std::vector<WriteSegment>> runs(3);
  uint64_t whole_blocks = 0;  // bytes of the blocks inside one writer's stretch
  size_t stretches = 0;
  for (size_t x = 0; x < kSize; ++stretches) {
    size_t end = x;
    while (end < kSize && writer_of(end) == writer_of(x)) ++end;
    const uint64_t a = (x + kDirectAlign - 1) / kDirectAlign * kDirectAlign, b = end / kDirectAlign * kDirectAlign;
    if (a < b) whole_blocks += b - a;
    for (size_t at = x; at < end; at += 7'777) {  // several runs per stretch
      runs[static_cast<size_t>(writer_of(x))].push_back({at, source.data() + at + 13, std::min<size_t>(7'777, end - at)});
    }
    x = end;
  }
  for (const fs::path& dir : two.dirs) {
    const bool direct_ok = takes_direct_io(dir);
    for (bool direct : {false, true}) {
      for (size_t piece : {kDirectAlign, size_t{1} << 20}) {
        const SaveTuning tuning{direct, 3, piece};
        const fs::path path = dir / fmt::format("runs_{}_{}", direct, piece);
        const uint64_t before = direct_write_bytes();
        std::vector<std::vector<PartDigest>> parts(3);
        std::vector<std::thread> writers;
        for (size_t w = 0; w < 3; ++w) {
          writers.emplace_back([&, w] {
            FileHandle h(path, O_WRONLY | O_CREAT);
            h.truncate(kSize);
            parts[w] = write_runs(h, runs[w], tuning);
            h.close();
          });
        }
        for (auto& t : writers) t.join();
        SCOPED_TRACE(path.string());
        EXPECT_EQ(read_all(path), expected);
        EXPECT_EQ(direct_write_bytes() - before, direct && direct_ok ? whole_blocks : 0);
        std::vector<PartDigest> all;
        for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
        std::sort(all.begin(), all.end(), [](const PartDigest& a, const PartDigest& b) { return a.offset < b.offset; });
        EXPECT_EQ(all.size(), stretches);
        uint64_t at = 0;
        for (const PartDigest& p : all) {
          ASSERT_EQ(p.offset, at);
          EXPECT_EQ(p.xxh64, xxh64_hex({expected.data() + at, p.n})) << "bytes " << at << " + " << p.n;
          at += p.n;
        }
        EXPECT_EQ(at, kSize);
      }
    }
  }
  ASSERT_GT(whole_blocks, 20 * kDirectAlign);  // the O_DIRECT part is exercised
  testing::skip_unless_direct_io(takes_direct_io(two.scratch.path), two.scratch.path);
}

// A model with tensors of odd byte sizes (no tensor starts or ends on a 4 KiB boundary).
std::vector<testing::GlobalTensor> odd_model() {
  return {{"model", "a.weight", testing::make_global(DType::F32, Shape{301, 37}, 1)},
          {"model", "b.weight", testing::make_global(DType::BF16, Shape{333, 5}, 2)},
          {"model", "c.bias", testing::make_global(DType::F32, Shape{37}, 3)},
          {"optimizer", "a.weight/exp_avg", testing::make_global(DType::F32, Shape{301, 37}, 4)}};
}

// Every file of a checkpoint directory, by name.
std::map<std::string, std::vector<std::byte>> files_of(const fs::path& dir) {
  std::map<std::string, std::vector<std::byte>> out;
  for (const auto& e : fs::directory_iterator(dir)) out[e.path().filename().string()] = read_all(e.path());
  return out;
}

fs::path save_on(const fs::path& root, const testing::Topology& topo, int ranks, bool sha256) {
  const auto model = odd_model();
  fs::path dir;
  comm::LocalWorld::run(ranks, [&](comm::Communicator& c) {
    SaveOptions options;
    options.sha256 = sha256;
    fs::path d = save_checkpoint(c, root, testing::content_for(model, topo, c.rank(), 1), options);
    if (c.rank() == 0) dir = d;
  });
  return dir;
}

TEST(SaveDirect, OneRankSaveWritesTheSerializedFileOnEveryPath) {
  SaveTuningGuard guard;
  TestDirs two;
  const auto model = odd_model();
  std::vector<StEntry> entries;
  for (const auto& t : model) {
    if (t.group == "model") entries.push_back(entry_of(t.name, t.value));
  }
  const std::vector<std::byte> reference = serialize_safetensors(entries, StMetadata{{"format", "pt"}});
  const testing::Topology single{"single", "1", {{"*", "R"}}};
  const testing::Topology tp2{"tp2", "tp=2", {{"*", "R"}, {"a.weight", "S(0)"}, {"b.weight", "S(1)"},
                                               {"a.weight/exp_avg", "S(1)"}}};
  for (const fs::path& dir : two.dirs) {
    const bool direct_ok = takes_direct_io(dir);
    save_tuning() = SaveTuning{false, 1, kDirectAlign};
    const auto buffered = files_of(save_on(dir / "buffered", single, 1, true));
    save_tuning() = SaveTuning{true, 3, 2 * kDirectAlign};  // many pieces per file
    const uint64_t before = direct_write_bytes();
    const fs::path direct_dir = save_on(dir / "direct", single, 1, true);
    EXPECT_EQ(direct_write_bytes() > before, direct_ok) << dir;
    const auto direct = files_of(direct_dir);
    // Two writers per file: a.weight's row blocks (stretches of 22 KB, long with a 4 KiB minimum)
    // written with O_DIRECT and digested by their writers, b.weight's column runs through the page
    // cache and digested by the owner between them; with a SHA-256 asked for, the file read back
    // whole by the owner.
    save_tuning().direct_min_stretch = kDirectAlign;
    uint64_t before_tp2 = direct_write_bytes();
    const auto sharded = files_of(save_on(dir / "tp2", tp2, 2, false));
    EXPECT_EQ(direct_write_bytes() > before_tp2, direct_ok) << dir;
    before_tp2 = direct_write_bytes();
    const auto sharded_sha = files_of(save_on(dir / "tp2sha", tp2, 2, true));
    EXPECT_EQ(direct_write_bytes(), before_tp2) << dir;
    ASSERT_TRUE(buffered.count("model-00001-of-00001.safetensors")) << dir;
    EXPECT_EQ(buffered.at("model-00001-of-00001.safetensors"), reference) << dir;
    for (const auto& [name, bytes] : buffered) {
      if (name == kManifestName) continue;  // saved_on names the mesh
      EXPECT_EQ(direct.at(name), bytes) << dir << " " << name;
      EXPECT_EQ(sharded.at(name), bytes) << dir << " " << name;
      EXPECT_EQ(sharded_sha.at(name), bytes) << dir << " " << name;
    }
    // The digests computed from memory are those of the files (verify re-reads them).
    const fs::path parted = dir / "tp2" / "checkpoint-1";
    for (const fs::path& d : {direct_dir, parted, dir / "tp2sha" / "checkpoint-1"}) {
      VerifyReport r = verify_checkpoint(d, true);
      EXPECT_TRUE(r.ok()) << d << ": " << (r.problems.empty() ? "" : r.problems.front());
    }
    const std::string manifest = read_text_file(parted / kManifestName);
    EXPECT_NE(manifest.find("xxh64_parts"), std::string::npos) << manifest;
    EXPECT_NE(manifest.find("\"version\": 2"), std::string::npos) << manifest;  // parts: version 2
    EXPECT_NE(read_text_file(direct_dir / kManifestName).find("\"version\": 1"), std::string::npos);
    {  // a manifest of a later version is refused by name, not misread
      const fs::path later = dir / "later";
      fs::create_directories(later);
      std::string text = manifest;
      text.replace(text.find("\"version\": 2"), 12, "\"version\": 3");
      std::ofstream(later / kManifestName) << text;
      VerifyReport r = verify_checkpoint(later, true);
      ASSERT_FALSE(r.ok());
      EXPECT_NE(r.problems.front().find("version 3 is newer than this shardwise reads (2)"), std::string::npos)
          << r.problems.front();
    }
    // A byte changed in a file digested by parts is found in the part that holds it: one in
    // a.weight's first row block (a writer's part), then one in the last tensor (the owner's).
    const fs::path model = parted / "model-00001-of-00001.safetensors";
    auto flip = [&](uint64_t at) {
      std::fstream f(model, std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(static_cast<std::streamoff>(at));
      const char c = static_cast<char>(f.get());
      f.seekp(static_cast<std::streamoff>(at));
      f.put(static_cast<char>(c ^ 0x5a));
    };
    flip(fs::file_size(model) / 4);
    VerifyReport bad = verify_checkpoint(parted, true);
    ASSERT_EQ(bad.problems.size(), 1u) << dir;
    EXPECT_NE(bad.problems.front().find("model-00001-of-00001.safetensors: xxh64 of bytes ["), std::string::npos)
        << bad.problems.front();
    flip(fs::file_size(model) - 7);
    EXPECT_EQ(verify_checkpoint(parted, true).problems.size(), 2u) << dir;
  }
  testing::skip_unless_direct_io(takes_direct_io(two.scratch.path), two.scratch.path);
}

}  // namespace
}  // namespace shardwise::ckpt
