#pragma once
// Reads one tensor group of a checkpoint directory: "<group>.safetensors.index.json" and its
// shards, or a single "<group>.safetensors" (as Hugging Face writes small models). Shard files are
// mapped and validated when first used.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shardwise/ckpt/safetensors_reader.h"

namespace shardwise::ckpt {

std::string index_file_name(std::string_view group);   // "model.safetensors.index.json"
std::string single_file_name(std::string_view group);  // "model.safetensors"
std::string shard_file_name(std::string_view group, size_t k, size_t n);  // "model-00001-of-00002.safetensors"

class GroupReader {
 public:
  GroupReader(const fs::path& dir, std::string group);
  static bool exists(const fs::path& dir, std::string_view group);

  const std::string& group() const { return group_; }
  const std::vector<std::string>& names() const { return names_; }  // sorted
  bool contains(std::string_view name) const { return file_of_.count(std::string(name)) > 0; }
  const std::string& file_name_of(std::string_view name) const;
  const SafetensorsFile& file_of(std::string_view name) const;
  const StTensorInfo& info(std::string_view name) const { return file_of(name).info(name); }
  std::vector<std::string> file_names() const;  // distinct, sorted
  // total_size from the index (sum of tensor bytes), or the sum over the single file.
  uint64_t total_size() const { return total_size_; }

 private:
  fs::path dir_;
  std::string group_;
  std::vector<std::string> names_;
  std::map<std::string, std::string> file_of_;
  uint64_t total_size_ = 0;
  mutable std::map<std::string, std::unique_ptr<SafetensorsFile>> open_;
};

}  // namespace shardwise::ckpt
