#pragma once
// The safetensors reader: maps a file and validates every rule of the format before trusting any
// of it. Each violation is an Error naming the file, the tensor (when one is at fault) and the
// rule, e.g. "safetensors file 'a.safetensors': tensor 'w': rule 'no gap or overlap': ...".
//
// Rules checked (in this order):
//   file size            at least the 8-byte header length
//   header size          the little-endian u64 N is at most 100 000 000 and 8 + N fits the file
//   header UTF-8         the N header bytes are valid UTF-8 (no overlongs, surrogates, > U+10FFFF)
//   header JSON          a JSON object (trailing spaces allowed), no key twice in any object
//   metadata             "__metadata__", when present, maps strings to strings
//   tensor entry         every other key maps to an object of exactly dtype, shape, data_offsets
//   dtype                one of BOOL, U8, I8, F8_E5M2, F8_E4M3, I16, F16, BF16, I32, F32, F64, I64
//   shape                a list of at most 8 non-negative integers
//   data_offsets         [begin, end], non-negative integers, begin <= end
//   size                 shape's element count x dtype size == end - begin (overflow-checked)
//   no gap or overlap    sorted by offset, the spans tile [0, data size) from 0 without holes
//   file length          8 + N + data size == file size
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardwise/ckpt/file_io.h"
#include "shardwise/ckpt/st_dtype.h"
#include "shardwise/core/shape.h"
#include "shardwise/reshard/blocks.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::ckpt {

inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct StTensorInfo {
  std::string name;
  StDType dtype = StDType::F32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // offsets in the data section (after the header)
  uint64_t nbytes() const { return end - begin; }
};

struct StHeader {
  bool has_metadata = false;
  std::vector<std::pair<std::string, std::string>> metadata;  // in file order
  std::vector<StTensorInfo> tensors;                          // in data-offset order
  uint64_t header_size = 0;                                   // N
  uint64_t data_start() const { return 8 + header_size; }
  uint64_t data_size() const { return tensors.empty() ? 0 : tensors.back().end; }
  const StTensorInfo* find(std::string_view name) const;
  const std::string* metadata_value(std::string_view key) const;
};

// Validates `bytes` as a whole safetensors file (`file` names it in messages).
StHeader parse_safetensors(std::span<const std::byte> bytes, std::string_view file);

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const fs::path& path);
  const fs::path& path() const { return map_.path(); }
  const StHeader& header() const { return header_; }
  const std::vector<StTensorInfo>& tensors() const { return header_.tensors; }
  // Error naming the file when absent.
  const StTensorInfo& info(std::string_view name) const;
  // The tensor's bytes inside the mapping.
  std::span<const std::byte> data(const StTensorInfo& info) const;
  // The whole tensor as a Tensor (Error for dtypes Tensor lacks: F8_E5M2, F8_E4M3, I16).
  Tensor read(std::string_view name) const;
  // Only `box` (global coordinates) of the tensor: reads just the byte ranges of the box.
  Tensor read_box(std::string_view name, const reshard::Box& box) const;
  // Elements [begin, begin + count) of `block` (a box of the tensor) seen flat, row-major, as a
  // 1-D tensor: reads just the byte ranges of those elements (flat_range_boxes).
  Tensor read_range(std::string_view name, const reshard::Box& block, int64_t begin, int64_t count) const;

 private:
  // Runs (file element offset, destination element offset, elements) of tensor `t` into `out`.
  struct Run {
    int64_t s, d, n;
  };
  // A fresh tensor of `shape` filled by the runs (which write every element).
  Tensor read_runs(const StTensorInfo& t, const std::vector<Run>& runs, DType dtype, const Shape& shape) const;
  void check_box(const StTensorInfo& t, const reshard::Box& box) const;

  MappedFile map_;
  StHeader header_;
};

// Strict UTF-8 check (exposed for the tests).
bool is_valid_utf8(std::string_view text);

}  // namespace shardwise::ckpt
