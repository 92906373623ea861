// Loading a tensor group on any mesh: each rank maps the shards and copies only its blocks.
#include <fnmatch.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>

#include "shardwise/ckpt/checkpoint.h"
#include "shardwise/ckpt/device_staging.h"
#include "shardwise/ckpt/fp8.h"
#include "shardwise/ckpt/group_reader.h"
#include "shardwise/ckpt/span_cache.h"
#include "shardwise/core/error.h"

namespace shardwise::ckpt {

namespace {

bool ignored(const std::string& name, const std::vector<std::string>& patterns) {
  for (const auto& p : patterns) {
    if (::fnmatch(p.c_str(), name.c_str(), 0) == 0) return true;
  }
  return false;
}

std::string listing(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < 20; ++i) s += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > 20) s += fmt::format(" and {} more", names.size() - 20);
  return s;
}

// The block `box` of a tensor stored under the placements `placed` (key_map.h): read straight from
// the stored tensor when one fused placement holds it, else assembled from the parts it meets (a
// stacked tensor's slices: an ep rank reads only the slices of its experts).
Tensor read_placed(const GroupReader& reader, std::span<const KeyPlacement> placed, const reshard::Box& box,
                   Fp8Block fp8) {
  if (placed.size() == 1 && !placed[0].is_slice()) return read_key_box(reader, placed[0].key, placed[0].to_key(box), fp8);
  Tensor out;
  for (const KeyPlacement& p : placed) {
    const reshard::Box part = reshard::intersect(box, p.part());
    if (part.numel() == 0) continue;
    Tensor piece = read_key_box(reader, p.key, p.to_key(part), fp8);
    if (!out.defined()) out = Tensor::uninitialized(piece.dtype(), box.shape);
    const size_t es = dtype_size(piece.dtype());
    const std::byte* src = piece.raw();
    std::byte* dst = out.raw();
    for_each_run(part, Region::of(part), Region::of(box), [&](int64_t s, int64_t d, int64_t n) {
      std::memcpy(dst + static_cast<size_t>(d) * es, src + static_cast<size_t>(s) * es, static_cast<size_t>(n) * es);
    });
  }
  return out;
}

// Elements [range.begin, range.begin + range.count) of the block `box`, flat: read straight from
// the stored tensor when the name is stored whole or fused into one key; a name stored as slices
// (MoE experts under a sharded optimizer) or in FP8 (dequantised by blocks) reads its block and
// keeps the range.
Tensor read_range_placed(const GroupReader& reader, const SafetensorsFile& file, const std::string& key,
                         std::span<const KeyPlacement> placed, const reshard::Box& box, const FlatRange& range,
                         Fp8Block fp8) {
  const bool codes = file.info(key).dtype == StDType::F8_E4M3;
  if (placed.empty() && !codes) return file.read_range(key, box, range.begin, range.count);
  if (placed.size() == 1 && !placed[0].is_slice() && !codes) {
    return reader.file_of(placed[0].key).read_range(placed[0].key, placed[0].to_key(box), range.begin, range.count);
  }
  Tensor whole = placed.empty() ? read_key_box(reader, key, box, fp8) : read_placed(reader, placed, box, fp8);
  if (!whole.defined()) return whole;  // an empty block meets no slice
  Tensor out = Tensor::uninitialized(whole.dtype(), Shape{range.count});
  const size_t es = dtype_size(whole.dtype());
  if (range.count > 0) {
    std::memcpy(out.raw(), whole.raw() + static_cast<size_t>(range.begin) * es, static_cast<size_t>(range.count) * es);
  }
  return out;
}

}  // namespace

std::map<std::string, Tensor> load_group(const fs::path& dir, std::string_view group, std::span<const LoadSpec> specs,
                                         int64_t process, const LoadOptions& options) {
  SpanCacheUse span_cache;  // ranks of this process loading at the same time share spans read once
  GroupReader reader(dir, std::string(group));
  std::set<std::string> asked, covered;  // names, and the file keys they are stored in
  std::vector<std::string> missing, unexpected;
  auto keys_of = [&](const std::string& name) {
    std::vector<std::string> keys;
    for (const KeyPlacement& p : options.keys.placements(name)) keys.push_back(p.key);
    if (keys.empty()) keys.push_back(name);
    return keys;
  };
  auto skipped = [&](const std::string& name, const std::vector<std::string>& keys) {
    if (ignored(name, options.ignore_keys)) return true;
    for (const std::string& k : keys)
      if (ignored(k, options.ignore_keys)) return true;
    return false;
  };
  for (const LoadSpec& s : specs) {
    SW_CHECK(asked.insert(s.name).second, "load '{}': tensor '{}' is asked for twice", group, s.name);
    const std::vector<std::string> keys = keys_of(s.name);
    covered.insert(keys.begin(), keys.end());
    if (skipped(s.name, keys)) continue;
    for (const std::string& key : keys) {
      if (!reader.contains(key)) missing.push_back(key == s.name ? s.name : fmt::format("{} (part of {})", key, s.name));
    }
  }
  for (const std::string& name : reader.names()) {
    if (covered.count(name) || ignored(name, options.ignore_keys)) continue;
    const std::optional<std::string> weight = fp8_weight_of_scale(reader, name);  // a scale is a part of its weight
    if (!weight || (!covered.count(*weight) && !ignored(*weight, options.ignore_keys))) unexpected.push_back(name);
  }
  if (!missing.empty() || !unexpected.empty()) {
    std::string msg = fmt::format("load group '{}' of '{}': keys do not match", group, dir.string());
    if (!missing.empty()) msg += fmt::format("; missing from the checkpoint ({}): {}", missing.size(), listing(missing));
    if (!unexpected.empty()) {
      msg += fmt::format("; in the checkpoint but not asked for ({}): {}", unexpected.size(), listing(unexpected));
    }
    fail("{} (LoadOptions::ignore_keys takes glob patterns of keys to skip)", msg);
  }
  // FP8 weights are read dequantised by their scales, whose block size config.json names (fp8.h):
  // read when the first one is met.
  std::optional<Fp8Block> fp8_block;
  std::map<std::string, Tensor> out;
  for (const LoadSpec& s : specs) {
    const std::vector<std::string> keys = keys_of(s.name);
    if (std::any_of(keys.begin(), keys.end(), [&](const std::string& k) { return !reader.contains(k); })) continue;
    const std::span<const KeyPlacement> placed = options.keys.placements(s.name);
    const std::string& key = keys.front();
    const SafetensorsFile& file = reader.file_of(key);
    const StTensorInfo& info = file.info(key);
    for (const KeyPlacement& p : placed) {
      const StTensorInfo& in = reader.file_of(p.key).info(p.key);
      SW_CHECK(in.shape == p.key_shape && p.shape == s.global_shape,
               "load '{}': tensor '{}' {} is read from '{}' as {}, but '{}' has shape {} in the checkpoint ({})", group,
               s.name, s.global_shape.to_string(), p.key, p.key_shape.to_string(), p.key, in.shape.to_string(),
               reader.file_of(p.key).path().filename().string());
      SW_CHECK(in.dtype == info.dtype, "load '{}': the stored parts of '{}' differ in dtype ('{}' {}, '{}' {})", group,
               s.name, key, st_dtype_name(info.dtype), p.key, st_dtype_name(in.dtype));
    }
    if (placed.empty()) {
      SW_CHECK(info.shape == s.global_shape, "load '{}': tensor '{}' has shape {} in the checkpoint ({}), asked for {}",
               group, s.name, info.shape.to_string(), file.path().filename().string(), s.global_shape.to_string());
    }
    // An FP8 weight is read dequantised, as f32.
    auto stored = info.dtype == StDType::F8_E4M3 ? std::optional<DType>(DType::F32) : to_tensor_dtype(info.dtype);
    SW_CHECK(stored, "load '{}': tensor '{}' is {} in the checkpoint, which shardwise tensors cannot hold", group,
             key, st_dtype_name(info.dtype));
    SW_CHECK(*stored == s.dtype || options.convert_dtype,
             "load '{}': tensor '{}' is {} in the checkpoint, asked for {}; conversion is explicit: set convert_dtype "
             "(--convert-dtype)", group, s.name, dtype_name(*stored), dtype_name(s.dtype));
    s.layout.dist.validate(s.global_shape.ndim(), s.layout.mesh.ndim(), s.name);
    for (int d = 0; d < s.layout.mesh.ndim(); ++d) {
      SW_CHECK(!s.layout.dist[d].is_partial(), "load '{}': tensor '{}': a Partial placement ({}) cannot be loaded; load "
               "Replicate or Shard and partialize after", group, s.name, s.layout.dist.to_string());
    }
    if (!s.layout.mesh.contains(process)) {
      out[s.name] = Tensor();
      continue;
    }
    if (info.dtype == StDType::F8_E4M3 && !fp8_block) fp8_block = fp8_block_of(dir);
    const Fp8Block fp8 = fp8_block.value_or(Fp8Block{});
    auto coords = s.layout.mesh.coords(s.layout.mesh.rank_index_of_process(process));
    reshard::Box box = reshard::block_at(s.global_shape, s.layout, coords);
    if (s.range) {
      SW_CHECK(s.range->begin >= 0 && s.range->count >= 0 && s.range->begin + s.range->count <= box.numel(),
               "load '{}': tensor '{}': process {} asks for elements [{}, {}) of its block {}, which has {} elements",
               group, s.name, process, s.range->begin, s.range->begin + s.range->count, box.shape.to_string(),
               box.numel());
    }
    Tensor block = s.range ? read_range_placed(reader, file, key, placed, box, *s.range, fp8)
                   : placed.empty() ? read_key_box(reader, key, box, fp8)
                                    : read_placed(reader, placed, box, fp8);
    if (!block.defined()) {  // an empty block meets no part
      block = Tensor::uninitialized(*stored, s.range ? Shape{s.range->count} : box.shape);
    }
    if (block.dtype() != s.dtype) block = block.to(s.dtype);
    out[s.name] = options.device.is_host() ? block : to_device_staged(block, options.device);
  }
  return out;
}

nlohmann::json load_json(const fs::path& dir, std::string_view file) {
  fs::path p = dir / file;
  SW_CHECK(fs::exists(p), "checkpoint '{}' has no {}", dir.string(), file);
  try {
    return nlohmann::json::parse(read_text_file(p));
  } catch (const nlohmann::json::exception& e) {
    fail("'{}' is not valid JSON: {}", p.string(), e.what());
  }
}

}  // namespace shardwise::ckpt
