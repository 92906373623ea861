#include "shardwise/ckpt/group_reader.h"

#include <nlohmann/json.hpp>

#include "shardwise/core/error.h"

namespace shardwise::ckpt {

std::string index_file_name(std::string_view group) { return fmt::format("{}.safetensors.index.json", group); }
std::string single_file_name(std::string_view group) { return fmt::format("{}.safetensors", group); }
std::string shard_file_name(std::string_view group, size_t k, size_t n) {
  return fmt::format("{}-{:05d}-of-{:05d}.safetensors", group, k, n);
}

bool GroupReader::exists(const fs::path& dir, std::string_view group) {
  return fs::exists(dir / index_file_name(group)) || fs::exists(dir / single_file_name(group));
}

GroupReader::GroupReader(const fs::path& dir, std::string group) : dir_(dir), group_(std::move(group)) {
  fs::path index = dir / index_file_name(group_);
  if (fs::exists(index)) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_text_file(index));
    } catch (const nlohmann::json::exception& e) {
      fail("index '{}' is not valid JSON: {}", index.string(), e.what());
    }
    SW_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
             "index '{}' has no \"weight_map\" object", index.string());
    for (const auto& [name, file] : j["weight_map"].items()) {
      SW_CHECK(file.is_string(), "index '{}': weight_map entry '{}' is not a file name", index.string(), name);
      const std::string& f = file.get_ref<const std::string&>();
      SW_CHECK(!f.empty() && f.find('/') == std::string::npos && f != "." && f != "..",
               "index '{}': tensor '{}' maps to '{}', which is not a file name in the checkpoint directory",
               index.string(), name, f);
      file_of_[name] = f;
    }
    if (j.contains("metadata") && j["metadata"].is_object() && j["metadata"].contains("total_size") &&
        j["metadata"]["total_size"].is_number_unsigned()) {
      total_size_ = j["metadata"]["total_size"].get<uint64_t>();
    }
  } else {
    std::string single = single_file_name(group_);
    SW_CHECK(fs::exists(dir / single), "'{}' has no tensor group '{}': neither {} nor {} exists", dir.string(), group_,
             index_file_name(group_), single);
    const SafetensorsFile& f = *(open_[single] = std::make_unique<SafetensorsFile>(dir / single));
    for (const auto& t : f.tensors()) file_of_[t.name] = single;
    total_size_ = f.header().data_size();
  }
  for (const auto& [name, file] : file_of_) names_.push_back(name);
}

const std::string& GroupReader::file_name_of(std::string_view name) const {
  auto it = file_of_.find(std::string(name));
  SW_CHECK(it != file_of_.end(), "checkpoint '{}' group '{}' has no tensor '{}'", dir_.string(), group_, name);
  return it->second;
}

const SafetensorsFile& GroupReader::file_of(std::string_view name) const {
  const std::string& file = file_name_of(name);
  auto& slot = open_[file];
  if (!slot) slot = std::make_unique<SafetensorsFile>(dir_ / file);
  SW_CHECK(slot->header().find(name) != nullptr, "checkpoint '{}': the index of group '{}' puts tensor '{}' in '{}', "
           "which does not hold it", dir_.string(), group_, name, file);
  return *slot;
}

std::vector<std::string> GroupReader::file_names() const {
  std::vector<std::string> out;
  for (const auto& [name, file] : file_of_) out.push_back(file);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace shardwise::ckpt
