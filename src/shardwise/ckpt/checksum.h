#pragma once
// File checksums of the manifest: xxHash64 (fast, always) and SHA-256 (optional, for integrity
// against tampering rather than accidents).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "shardwise/ckpt/file_io.h"

namespace shardwise::ckpt {

// The xxh64 of bytes [offset, offset + n) of a file.
struct PartDigest {
  uint64_t offset = 0, n = 0;
  std::string xxh64;
};

struct FileDigest {
  uint64_t size = 0;
  std::string xxh64;   // 16 lowercase hex digits (empty where `parts` stand for it)
  std::string sha256;  // 64 lowercase hex digits, empty when not computed
  // A file several ranks wrote: the xxh64 of each stretch one rank wrote, tiling the file, computed
  // from memory by its writer (an xxh64 of the whole cannot be combined from parts).
  std::vector<PartDigest> parts;
};

std::string xxh64_hex(std::span<const std::byte> bytes);

// Both digests of a byte stream given in order, piece by piece (a file's bytes as they are
// written, so the save need not read the file back).
class StreamDigest {
 public:
  explicit StreamDigest(bool with_sha256);
  ~StreamDigest();
  StreamDigest(const StreamDigest&) = delete;
  StreamDigest& operator=(const StreamDigest&) = delete;
  void update(std::span<const std::byte> bytes);
  FileDigest finish();  // once

 private:
  struct State;
  std::unique_ptr<State> state_;
};

std::string sha256_hex(std::span<const std::byte> bytes);
// Reads the file once (mapped) and computes both digests (SHA-256 only when asked).
FileDigest digest_file(const fs::path& path, bool with_sha256);

// A cheap identity of a file too large to hash whole each time: its size and the xxHash64 of its
// first and of its last MiB (the same MiB for a file under 1 MiB). Error when it cannot be read.
struct FileSample {
  int64_t size = 0;
  std::string head_xxh64, tail_xxh64;
};
FileSample sample_file(const fs::path& path);

}  // namespace shardwise::ckpt
