#pragma once
// The safetensors writer. Files are laid out as the reference library lays them out: tensors
// sorted by dtype alignment (descending, in StDType order) then by name; the header is compact
// JSON with "__metadata__" first (when given) and each entry as {"dtype","shape","data_offsets"},
// padded with spaces to a multiple of 8 bytes so every tensor's data is 8-byte aligned in the
// file. Files go to a temporary name, are fsync'ed and renamed into place: a file that is mapped
// elsewhere is never written into.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "shardwise/ckpt/file_io.h"
#include "shardwise/ckpt/safetensors_reader.h"

namespace shardwise::ckpt {

using StMetadata = std::vector<std::pair<std::string, std::string>>;

// What a file will hold, before any data: name, dtype and shape per tensor.
struct StSpec {
  std::string name;
  StDType dtype = StDType::F32;
  Shape shape;
  uint64_t nbytes() const;  // overflow-checked
};

// The layout of a file: its header bytes (8-byte length + padded JSON) and every tensor with its
// data offsets, in file order. `order[i]` is the index in the input of the i-th tensor in the file.
struct StLayout {
  std::string header;
  std::vector<StTensorInfo> tensors;
  std::vector<size_t> order;
  uint64_t data_start() const { return header.size(); }
  uint64_t file_size() const { return header.size() + (tensors.empty() ? 0 : tensors.back().end); }
};

// Error (naming `file`) for a name given twice, "__metadata__" as a tensor name, non-UTF-8 text.
StLayout layout_safetensors(std::span<const StSpec> specs, const std::optional<StMetadata>& metadata,
                            std::string_view file = "<memory>");

// A tensor to write: its spec and its bytes (exactly spec.nbytes()).
struct StEntry {
  StSpec spec;
  std::span<const std::byte> data;
};
StEntry entry_of(const std::string& name, const Tensor& t);

// Writes a whole file atomically (temporary file, fsync, rename, directory fsync).
void write_safetensors(const fs::path& path, std::span<const StEntry> entries,
                       const std::optional<StMetadata>& metadata = std::nullopt);
// The file's bytes in memory (for tests and the fuzzer corpus).
std::vector<std::byte> serialize_safetensors(std::span<const StEntry> entries,
                                             const std::optional<StMetadata>& metadata = std::nullopt);

// JSON string literal as serde_json writes it (escapes ", \, control characters).
std::string json_quote(std::string_view s);

}  // namespace shardwise::ckpt
