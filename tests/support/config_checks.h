#pragma once
// The config.json refusal checks the Hugging Face layout tests share.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "shardwise/core/error.h"
#include "shardwise/models/model_io.h"

namespace shardwise::train {

// Whether read_model_config refuses `config` with `key` set to `value` (written to dir/config.json)
// with an error naming the key.
inline bool config_refused(const std::filesystem::path& dir, nlohmann::json config, const std::string& key,
                           const nlohmann::json& value) {
  config[key] = value;
  std::ofstream(dir / "config.json") << config.dump();
  try {
    read_model_config(dir);
  } catch (const Error& e) {
    return std::string(e.what()).find(key) != std::string::npos;
  }
  return false;
}

}  // namespace shardwise::train
