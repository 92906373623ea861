#include "shardwise/ckpt/safetensors_writer.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <set>

#include "shardwise/core/error.h"

namespace shardwise::ckpt {

uint64_t StSpec::nbytes() const {
  uint64_t n = st_dtype_size(dtype);
  for (int64_t d : shape) {
    SW_CHECK(d >= 0, "tensor '{}': negative extent in shape {}", name, shape.to_string());
    SW_CHECK(!__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n), "tensor '{}': byte size of {} overflows",
             name, shape.to_string());
  }
  return n;
}

std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (u < 0x20) out += fmt::format("\\u{:04x}", u);
        else out += c;
    }
  }
  return out + "\"";
}

StLayout layout_safetensors(std::span<const StSpec> specs, const std::optional<StMetadata>& metadata,
                            std::string_view file) {
  StLayout L;
  L.order.resize(specs.size());
  std::iota(L.order.begin(), L.order.end(), size_t{0});
  std::sort(L.order.begin(), L.order.end(), [&](size_t a, size_t b) {
    if (specs[a].dtype != specs[b].dtype) return specs[a].dtype > specs[b].dtype;
    return specs[a].name < specs[b].name;
  });
  std::string json = "{";
  bool first = true;
  if (metadata) {
    json += "\"__metadata__\":{";
    std::set<std::string_view> keys;
    for (size_t i = 0; i < metadata->size(); ++i) {
      const auto& [k, v] = (*metadata)[i];
      SW_CHECK(keys.insert(k).second, "safetensors file '{}': metadata key '{}' given twice", file, k);
      SW_CHECK(is_valid_utf8(k) && is_valid_utf8(v), "safetensors file '{}': metadata '{}' is not valid UTF-8", file, k);
      if (i) json += ',';
      json += json_quote(k) + ':' + json_quote(v);
    }
    json += '}';
    first = false;
  }
  uint64_t at = 0;
  for (size_t i = 0; i < L.order.size(); ++i) {
    const StSpec& s = specs[L.order[i]];
    SW_CHECK(s.name != "__metadata__", "safetensors file '{}': '__metadata__' cannot name a tensor", file);
    SW_CHECK(is_valid_utf8(s.name), "safetensors file '{}': tensor name '{}' is not valid UTF-8", file, s.name);
    SW_CHECK(i == 0 || specs[L.order[i - 1]].name != s.name || specs[L.order[i - 1]].dtype != s.dtype,
             "safetensors file '{}': tensor '{}' given twice", file, s.name);
    StTensorInfo t{s.name, s.dtype, s.shape, at, 0};
    SW_CHECK(!__builtin_add_overflow(at, s.nbytes(), &t.end), "safetensors file '{}': data size overflows", file);
    at = t.end;
    if (!first) json += ',';
    first = false;
    json += json_quote(s.name) + ":{\"dtype\":\"" + std::string(st_dtype_name(s.dtype)) + "\",\"shape\":[";
    for (int d = 0; d < s.shape.ndim(); ++d) json += (d ? "," : "") + std::to_string(s.shape[d]);
    json += "],\"data_offsets\":[" + std::to_string(t.begin) + "," + std::to_string(t.end) + "]}";
    L.tensors.push_back(std::move(t));
  }
  json += '}';
  // Names differing only in dtype would pass the adjacent check above: check globally.
  std::set<std::string_view> names;
  for (const StSpec& s : specs) SW_CHECK(names.insert(s.name).second, "safetensors file '{}': tensor '{}' given twice", file, s.name);
  json.append((8 - json.size() % 8) % 8, ' ');
  SW_CHECK(json.size() <= kMaxHeaderBytes, "safetensors file '{}': header of {} bytes exceeds the cap of {}", file,
           json.size(), kMaxHeaderBytes);
  uint64_t n = json.size();
  L.header.resize(8);
  for (int i = 0; i < 8; ++i) L.header[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  L.header += json;
  return L;
}

StEntry entry_of(const std::string& name, const Tensor& t) {
  return {StSpec{name, to_st_dtype(t.dtype()), t.shape()}, std::span<const std::byte>(t.raw(), t.nbytes())};
}

namespace {

StLayout checked_layout(std::span<const StEntry> entries, const std::optional<StMetadata>& metadata,
                        std::string_view file) {
  std::vector<StSpec> specs;
  for (const StEntry& e : entries) {
    SW_CHECK(e.data.size() == e.spec.nbytes(), "safetensors file '{}': tensor '{}' of {} {} needs {} bytes, got {}",
             file, e.spec.name, st_dtype_name(e.spec.dtype), e.spec.shape.to_string(), e.spec.nbytes(), e.data.size());
    specs.push_back(e.spec);
  }
  return layout_safetensors(specs, metadata, file);
}

}  // namespace

std::vector<std::byte> serialize_safetensors(std::span<const StEntry> entries, const std::optional<StMetadata>& metadata) {
  StLayout L = checked_layout(entries, metadata, "<memory>");
  std::vector<std::byte> out(static_cast<size_t>(L.file_size()));
  std::memcpy(out.data(), L.header.data(), L.header.size());
  for (size_t i = 0; i < L.order.size(); ++i) {
    const auto& d = entries[L.order[i]].data;
    if (!d.empty()) std::memcpy(out.data() + L.data_start() + L.tensors[i].begin, d.data(), d.size());
  }
  return out;
}

void write_safetensors(const fs::path& path, std::span<const StEntry> entries, const std::optional<StMetadata>& metadata) {
  StLayout L = checked_layout(entries, metadata, path.string());
  write_file_atomic(path, [&](FileHandle& f) {
    f.write_all(std::as_bytes(std::span<const char>(L.header.data(), L.header.size())));
    for (size_t i : L.order) f.write_all(entries[i].data);
  });
}

}  // namespace shardwise::ckpt
