#include "shardwise/ckpt/safetensors_reader.h"

#include <fcntl.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "shardwise/ckpt/box_runs.h"
#include "shardwise/ckpt/parallel_read.h"
#include "shardwise/ckpt/span_cache.h"
#include "shardwise/core/error.h"

namespace shardwise::ckpt {

namespace {

using ojson = nlohmann::ordered_json;

// Error prefix: the file, then the tensor when one is at fault, then the rule.
[[noreturn]] void broken(std::string_view file, std::string_view tensor, std::string_view rule,
                         const std::string& detail) {
  if (tensor.empty()) fail("safetensors file '{}': rule '{}': {}", file, rule, detail);
  fail("safetensors file '{}': tensor '{}': rule '{}': {}", file, tensor, rule, detail);
}

uint64_t read_le64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

std::string short_json(const ojson& j) {
  std::string s = j.dump(-1, ' ', false, ojson::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

std::string printable(std::string_view name) {
  std::string out;
  for (char c : name.substr(0, 120)) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) out += fmt::format("\\x{:02x}", u);
    else out += c;
  }
  if (name.size() > 120) out += "...";
  return out;
}

StTensorInfo parse_entry(std::string_view file, const std::string& name, const ojson& entry) {
  std::string shown = printable(name);
  if (!entry.is_object()) {
    broken(file, shown, "tensor entry", "expected an object with dtype, shape, data_offsets, got " + short_json(entry));
  }
  for (const auto& [key, value] : entry.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      broken(file, shown, "tensor entry",
             fmt::format("unknown key '{}' (allowed: dtype, shape, data_offsets)", printable(key)));
    }
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(key)) broken(file, shown, "tensor entry", fmt::format("missing key '{}'", key));
  }
  StTensorInfo info;
  info.name = name;
  const ojson& dtype = entry["dtype"];
  if (!dtype.is_string()) broken(file, shown, "dtype", "expected a string, got " + short_json(dtype));
  auto st = parse_st_dtype(dtype.get_ref<const std::string&>());
  if (!st) {
    broken(file, shown, "dtype",
           fmt::format("unknown dtype '{}' (allowed: {})", printable(dtype.get_ref<const std::string&>()),
                       st_dtype_names()));
  }
  info.dtype = *st;
  const ojson& shape = entry["shape"];
  if (!shape.is_array()) broken(file, shown, "shape", "expected a list of integers, got " + short_json(shape));
  if (shape.size() > static_cast<size_t>(kMaxDims)) {
    broken(file, shown, "shape", fmt::format("{} dims; shardwise reads at most {}", shape.size(), kMaxDims));
  }
  uint64_t numel = 1;
  for (const ojson& d : shape) {
    if (!d.is_number_unsigned()) {
      broken(file, shown, "shape", "extents must be non-negative integers, got " + short_json(shape));
    }
    uint64_t v = d.get<uint64_t>();
    if (v > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(numel, v, &numel)) {
      broken(file, shown, "size", fmt::format("element count of shape {} overflows 64 bits", short_json(shape)));
    }
    info.shape.push_back(static_cast<int64_t>(v));
  }
  const ojson& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    broken(file, shown, "data_offsets", "expected [begin, end] of non-negative integers, got " + short_json(offsets));
  }
  info.begin = offsets[0].get<uint64_t>();
  info.end = offsets[1].get<uint64_t>();
  if (info.begin > info.end) {
    broken(file, shown, "data_offsets", fmt::format("begin {} is after end {}", info.begin, info.end));
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(st_dtype_size(info.dtype)), &nbytes)) {
    broken(file, shown, "size", fmt::format("byte size of shape {} x {} overflows 64 bits", short_json(shape),
                                            st_dtype_name(info.dtype)));
  }
  if (nbytes != info.end - info.begin) {
    broken(file, shown, "size",
           fmt::format("shape {} of {} needs {} bytes but data_offsets [{}, {}] span {}", short_json(shape),
                       st_dtype_name(info.dtype), nbytes, info.begin, info.end, info.end - info.begin));
  }
  return info;
}

// Nesting depth of JSON text (brackets outside strings), counted without recursion: a valid header
// nests 3 levels, and the JSON library recurses on deep values (a stack overflow, not an Error).
size_t json_depth(std::string_view text) {
  size_t depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

constexpr size_t kMaxJsonDepth = 64;

}  // namespace

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0) { len = 2; cp = c & 0x1fu; }
    else if ((c & 0xf0) == 0xe0) { len = 3; cp = c & 0x0fu; }
    else if ((c & 0xf8) == 0xf0) { len = 4; cp = c & 0x07u; }
    else return false;
    if (i + static_cast<size_t>(len) > n) return false;
    for (int k = 1; k < len; ++k) {
      auto cc = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3fu);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)) return false;  // overlong
    if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += static_cast<size_t>(len);
  }
  return true;
}

const StTensorInfo* StHeader::find(std::string_view name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

const std::string* StHeader::metadata_value(std::string_view key) const {
  for (const auto& [k, v] : metadata) {
    if (k == key) return &v;
  }
  return nullptr;
}

StHeader parse_safetensors(std::span<const std::byte> bytes, std::string_view file) {
  const uint64_t file_size = bytes.size();
  if (file_size < 8) {
    broken(file, "", "file size", fmt::format("{} bytes, shorter than the 8-byte header length", file_size));
  }
  StHeader h;
  h.header_size = read_le64(bytes.data());
  if (h.header_size > kMaxHeaderBytes) {
    broken(file, "", "header size", fmt::format("header length {} exceeds the cap of {} bytes", h.header_size,
                                                kMaxHeaderBytes));
  }
  if (h.header_size > file_size - 8) {
    broken(file, "", "header size",
           fmt::format("header length {} runs past the end of the {}-byte file", h.header_size, file_size));
  }
  std::string_view text(reinterpret_cast<const char*>(bytes.data()) + 8, static_cast<size_t>(h.header_size));
  if (!is_valid_utf8(text)) broken(file, "", "header UTF-8", "the JSON header is not valid UTF-8");
  if (json_depth(text) > kMaxJsonDepth) {
    broken(file, "", "header JSON", fmt::format("nested deeper than {} levels (a header needs 3)", kMaxJsonDepth));
  }

  // Duplicate keys: nlohmann keeps the last silently; the format has one value per name.
  std::vector<std::set<std::string>> seen;
  std::string duplicate;
  ojson::parser_callback_t track = [&](int, ojson::parse_event_t event, ojson& parsed) {
    if (event == ojson::parse_event_t::object_start) seen.emplace_back();
    else if (event == ojson::parse_event_t::object_end && !seen.empty()) seen.pop_back();
    else if (event == ojson::parse_event_t::key && !seen.empty() && duplicate.empty() &&
             !seen.back().insert(parsed.get<std::string>()).second) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  ojson j;
  try {
    j = ojson::parse(text.begin(), text.end(), track);
  } catch (const ojson::exception& e) {
    broken(file, "", "header JSON", e.what());
  }
  if (!duplicate.empty()) broken(file, printable(duplicate), "header JSON", "the key appears more than once");
  if (!j.is_object()) broken(file, "", "header JSON", "the header is not a JSON object");

  for (const auto& [key, value] : j.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) broken(file, "", "metadata", "__metadata__ must be an object of strings");
      h.has_metadata = true;
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) {
          broken(file, "", "metadata", fmt::format("value of '{}' is {}, not a string", printable(mk), short_json(mv)));
        }
        h.metadata.emplace_back(mk, mv.get<std::string>());
      }
      continue;
    }
    h.tensors.push_back(parse_entry(file, key, value));
  }
  std::stable_sort(h.tensors.begin(), h.tensors.end(),
                   [](const StTensorInfo& a, const StTensorInfo& b) { return std::pair(a.begin, a.end) < std::pair(b.begin, b.end); });
  uint64_t at = 0;
  for (const StTensorInfo& t : h.tensors) {
    if (t.begin != at) {
      broken(file, printable(t.name), "no gap or overlap",
             fmt::format("data_offsets [{}, {}] {} the previous tensor's end {}", t.begin, t.end,
                         t.begin > at ? "leave a gap after" : "overlap", at));
    }
    at = t.end;
  }
  uint64_t expected = 0;
  if (__builtin_add_overflow(8 + h.header_size, at, &expected) || expected != file_size) {
    broken(file, "", "file length",
           fmt::format("8 + header {} + data {} bytes != file size {}", h.header_size, at, file_size));
  }
  return h;
}

SafetensorsFile::SafetensorsFile(const fs::path& path) : map_(path) {
  header_ = parse_safetensors(map_.bytes(), path.string());
}

const StTensorInfo& SafetensorsFile::info(std::string_view name) const {
  const StTensorInfo* t = header_.find(name);
  if (!t) fail("safetensors file '{}' has no tensor '{}'", path().string(), name);
  return *t;
}

std::span<const std::byte> SafetensorsFile::data(const StTensorInfo& t) const {
  return map_.bytes().subspan(static_cast<size_t>(header_.data_start() + t.begin), static_cast<size_t>(t.nbytes()));
}

namespace {

DType tensor_dtype_or_fail(const fs::path& path, const StTensorInfo& t) {
  auto d = to_tensor_dtype(t.dtype);
  if (!d) {
    fail("safetensors file '{}': tensor '{}' is {}, which shardwise tensors cannot hold (read its raw bytes "
         "instead, or convert the checkpoint)",
         path.string(), t.name, st_dtype_name(t.dtype));
  }
  return *d;
}

}  // namespace

Tensor SafetensorsFile::read(std::string_view name) const {
  const StTensorInfo& t = info(name);
  Tensor out(tensor_dtype_or_fail(path(), t), t.shape);
  auto src = data(t);
  if (!src.empty()) std::memcpy(out.raw(), src.data(), src.size());
  return out;
}

void SafetensorsFile::check_box(const StTensorInfo& t, const reshard::Box& box) const {
  SW_CHECK(box.shape.ndim() == t.shape.ndim(), "safetensors file '{}': tensor '{}' has {} dims, asked for a {}-d box",
           path().string(), t.name, t.shape.ndim(), box.shape.ndim());
  for (int d = 0; d < t.shape.ndim(); ++d) {
    auto i = static_cast<size_t>(d);
    SW_CHECK(box.offset[i] >= 0 && box.shape[d] >= 0 && box.offset[i] + box.shape[d] <= t.shape[d],
             "safetensors file '{}': tensor '{}' of shape {}: box dim {} [{}, {}) is out of range", path().string(),
             t.name, t.shape.to_string(), d, box.offset[i], box.offset[i] + box.shape[d]);
  }
}

Tensor SafetensorsFile::read_box(std::string_view name, const reshard::Box& box) const {
  const StTensorInfo& t = info(name);
  DType dtype = tensor_dtype_or_fail(path(), t);
  check_box(t, box);
  std::vector<Run> runs;
  for_each_run(box, Region::whole(t.shape), Region::of(box), [&](int64_t s, int64_t d, int64_t n) { runs.push_back({s, d, n}); });
  return read_runs(t, runs, dtype, box.shape);
}

Tensor SafetensorsFile::read_range(std::string_view name, const reshard::Box& block, int64_t begin, int64_t count) const {
  const StTensorInfo& t = info(name);
  DType dtype = tensor_dtype_or_fail(path(), t);
  check_box(t, block);
  SW_CHECK(begin >= 0 && count >= 0 && begin + count <= block.numel(),
           "safetensors file '{}': tensor '{}': elements [{}, {}) of a block of {} elements asked for", path().string(),
           t.name, begin, begin + count, block.numel());
  // Each box of the range is contiguous in the block: its runs land at their flat offsets in the
  // block, less `begin`.
  std::vector<Run> runs;
  for (const reshard::Box& b : flat_range_boxes(block, begin, count)) {
    for_each_run(b, Region::whole(t.shape), Region::of(block),
                 [&](int64_t s, int64_t d, int64_t n) { runs.push_back({s, d - begin, n}); });
  }
  return read_runs(t, runs, dtype, Shape{count});
}

Tensor SafetensorsFile::read_runs(const StTensorInfo& t, const std::vector<Run>& runs, DType dtype, const Shape& shape) const {
  const LoadTuning& tuning = load_tuning();
  const size_t es = dtype_size(dtype);
  const std::byte* src = data(t).data();
  const auto base = static_cast<uint64_t>(src - map_.data());
  int64_t needed = 0;
  for (const Run& r : runs) needed += r.n;
  // Runs that average direct_min_run bytes or more are read with O_DIRECT straight into place: the
  // destination starts at the file offset's residue modulo the alignment (every run of a box keeps
  // it when the runs' strides are whole blocks). Shorter runs share the page cache with the other
  // ranks reading the same rows, and so does a span mostly in the page cache already (a file just
  // written or read): memory is faster than the disk. Huge pages for the destination and the reader
  // threads are chosen by measurement (LoadTuning, BENCHMARKS.md).
  // Short runs spread over a span (a column block: every rank of the process needs bytes of every
  // row) go through the process's span cache when a load holds one: the span read once with
  // O_DIRECT, each rank copying its runs out. A process loading alone reads such a span through the
  // page cache in pieces of megabytes (pread_span_pieces), which the other processes of the node
  // loading other columns of the same rows then read from memory.
  const uint64_t span = runs.empty() ? 0 : static_cast<uint64_t>(runs.back().s + runs.back().n - runs.front().s) * es;
  const bool long_runs = static_cast<size_t>(needed) * es >= tuning.direct_min_run * runs.size();
  const bool column_block = runs.size() > 1 && !long_runs && 16 * static_cast<uint64_t>(needed) * es >= span;
  const bool spread = column_block && tuning.span_cache_bytes > 0 && span_cache_shared();
  const bool uncached = (long_runs || column_block) && !runs.empty() &&
                        !map_.mostly_cached(base + static_cast<uint64_t>(runs.front().s) * es, span);
  const bool direct = tuning.direct && uncached && long_runs;
  size_t lead = 0;
  if (direct) {
    lead = static_cast<size_t>((base + static_cast<uint64_t>(runs.front().s - runs.front().d) * es) % kDirectAlign);
    if (lead % es != 0) lead = 0;  // a foreign file off its element alignment: buffered reads
  }
  Tensor out = Tensor::uninitialized_at(dtype, shape, tuning.huge_pages, lead);  // every run writes its part
  if (runs.empty()) return out;
  std::byte* dst = out.raw();
  const int64_t first = runs.front().s, last = runs.back().s + runs.back().n;
  const auto file_offset = base + static_cast<uint64_t>(first) * es;
  auto ranges_of_runs = [&] {
    std::vector<ReadRange> ranges;
    ranges.reserve(runs.size());
    for (const Run& r : runs) {
      ranges.push_back({base + static_cast<uint64_t>(r.s) * es, dst + static_cast<size_t>(r.d) * es, static_cast<size_t>(r.n) * es});
    }
    return ranges;
  };
  if (direct) {
    pread_ranges_direct(FileHandle(path(), O_RDONLY), ranges_of_runs(), tuning.direct_requests, tuning.direct_piece);
  } else if (tuning.direct && uncached && spread &&
             read_through_span_cache(path(), map_.size(), ranges_of_runs(), tuning.direct_requests, tuning.direct_piece)) {
    // read (false: no O_DIRECT on this file system, the page-cache paths below)
  } else if (column_block && tuning.span_pieces && (uncached || static_cast<size_t>(needed) * es < 4096 * runs.size())) {
    // From the disk, or runs under a page each (a pread apiece would cost more than the copy).
    pread_span_pieces(FileHandle(path(), O_RDONLY), ranges_of_runs(), tuning.reader_threads, tuning.piece_bytes);
  } else if (runs.size() == 1 || static_cast<size_t>(needed) * es >= 4096 * runs.size()) {
    // A box's runs are all alike; a range's head and tail runs may be shorter: the mean decides.
    const std::vector<ReadRange> ranges = ranges_of_runs();
    FileHandle file(path(), O_RDONLY);
    if (tuning.will_need) {  // the disk starts on the whole span while the readers fault their pages in
      ::posix_fadvise(file.fd(), static_cast<off_t>(file_offset), static_cast<off_t>(last - first) * static_cast<off_t>(es),
                      POSIX_FADV_WILLNEED);
    }
    pread_ranges(file, ranges, tuning.reader_threads, tuning.piece_bytes);
  } else {
    for (const Run& r : runs) {
      std::memcpy(dst + static_cast<size_t>(r.d) * es, src + static_cast<size_t>(r.s) * es, static_cast<size_t>(r.n) * es);
    }
  }
  return out;
}

}  // namespace shardwise::ckpt
