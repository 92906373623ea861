// Loading a tensor group on any mesh: each rank maps the shards and copies only its blocks.
#include <fnmatch.h>

#include <set>

#include "shardwise/ckpt/checkpoint.h"
#include "shardwise/ckpt/group_reader.h"
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

}  // namespace

std::map<std::string, Tensor> load_group(const fs::path& dir, std::string_view group, std::span<const LoadSpec> specs,
                                         int64_t process, const LoadOptions& options) {
  GroupReader reader(dir, std::string(group));
  std::set<std::string> asked, covered;  // names, and the file keys they are stored in
  std::vector<std::string> missing, unexpected;
  auto key_of = [&](const std::string& name) -> const std::string& {
    const KeyPlacement* p = options.keys.find(name);
    return p ? p->key : name;
  };
  for (const LoadSpec& s : specs) {
    SW_CHECK(asked.insert(s.name).second, "load '{}': tensor '{}' is asked for twice", group, s.name);
    const std::string& key = key_of(s.name);
    covered.insert(key);
    if (!reader.contains(key) && !ignored(s.name, options.ignore_keys) && !ignored(key, options.ignore_keys))
      missing.push_back(key == s.name ? s.name : fmt::format("{} (part of {})", key, s.name));
  }
  for (const std::string& name : reader.names()) {
    if (!covered.count(name) && !ignored(name, options.ignore_keys)) unexpected.push_back(name);
  }
  if (!missing.empty() || !unexpected.empty()) {
    std::string msg = fmt::format("load group '{}' of '{}': keys do not match", group, dir.string());
    if (!missing.empty()) msg += fmt::format("; missing from the checkpoint ({}): {}", missing.size(), listing(missing));
    if (!unexpected.empty()) {
      msg += fmt::format("; in the checkpoint but not asked for ({}): {}", unexpected.size(), listing(unexpected));
    }
    fail("{} (LoadOptions::ignore_keys takes glob patterns of keys to skip)", msg);
  }
  std::map<std::string, Tensor> out;
  for (const LoadSpec& s : specs) {
    const std::string& key = key_of(s.name);
    if (!reader.contains(key)) continue;  // ignored
    const KeyPlacement* placed = options.keys.find(s.name);
    const SafetensorsFile& file = reader.file_of(key);
    const StTensorInfo& info = file.info(key);
    if (placed) {
      SW_CHECK(info.shape == placed->key_shape && placed->shape == s.global_shape,
               "load '{}': tensor '{}' {} is read from '{}' as {}, but '{}' has shape {} in the checkpoint ({})", group,
               s.name, s.global_shape.to_string(), key, placed->key_shape.to_string(), key, info.shape.to_string(),
               file.path().filename().string());
    } else {
      SW_CHECK(info.shape == s.global_shape, "load '{}': tensor '{}' has shape {} in the checkpoint ({}), asked for {}",
               group, s.name, info.shape.to_string(), file.path().filename().string(), s.global_shape.to_string());
    }
    auto stored = to_tensor_dtype(info.dtype);
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
    auto coords = s.layout.mesh.coords(s.layout.mesh.rank_index_of_process(process));
    reshard::Box box = reshard::block_at(s.global_shape, s.layout, coords);
    if (placed) {
      for (size_t d = 0; d < placed->offset.size(); ++d) box.offset[d] += placed->offset[d];
    }
    if (s.range) {
      SW_CHECK(s.range->begin >= 0 && s.range->count >= 0 && s.range->begin + s.range->count <= box.numel(),
               "load '{}': tensor '{}': process {} asks for elements [{}, {}) of its block {}, which has {} elements",
               group, s.name, process, s.range->begin, s.range->begin + s.range->count, box.shape.to_string(),
               box.numel());
    }
    Tensor block = s.range ? file.read_range(key, box, s.range->begin, s.range->count) : file.read_box(key, box);
    out[s.name] = block.dtype() == s.dtype ? block : block.to(s.dtype);
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
