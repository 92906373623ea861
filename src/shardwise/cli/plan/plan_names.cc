#include "shardwise/cli/plan/plan_names.h"

#include <cctype>

#include "shardwise/models/model_io.h"

namespace shardwise::cli {

namespace {

// "transformer.h.0.attn.q_proj.weight" -> {"transformer.h.0.attn.q_proj", "weight"}.
std::pair<std::string, std::string> split_last(const std::string& name) {
  const size_t dot = name.rfind('.');
  return {name.substr(0, dot), name.substr(dot + 1)};
}

bool name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == ':'; }

}  // namespace

CheckpointNames::CheckpointNames(const train::GptConfig& config) {
  const ckpt::KeyMap keys = train::model_key_map(config);
  for (const auto& [name, placements] : keys.entries()) {
    if (placements.size() != 1 || placements[0].is_slice()) continue;  // Mixtral's experts keep their stacked name
    const auto [param_prefix, suffix] = split_last(name);
    const auto [key_prefix, key_suffix] = split_last(placements[0].key);
    std::string part = split_last(param_prefix).second;  // q_proj
    if (part.ends_with("_proj")) part.resize(part.size() - 5);
    params_[name] = fmt::format("{}.{}({})", key_prefix, key_suffix, part);
    prefixes_[param_prefix] = fmt::format("{}({})", key_prefix, part);
  }
}

std::string CheckpointNames::shown(std::string_view name) const {
  if (auto it = params_.find(name); it != params_.end()) return it->second;
  for (size_t dot = name.find('.'); dot != std::string_view::npos; dot = name.find('.', dot + 1)) {
    if (auto it = prefixes_.find(name.substr(0, dot)); it != prefixes_.end())
      return it->second + std::string(name.substr(dot));
  }
  return std::string(name);
}

std::string CheckpointNames::rename(std::string_view text) const {
  if (params_.empty()) return std::string(text);
  std::string out;
  out.reserve(text.size() + text.size() / 8);
  for (size_t i = 0; i < text.size();) {
    if (!name_char(text[i])) {
      out += text[i++];
      continue;
    }
    size_t end = i;
    while (end < text.size() && name_char(text[end])) ++end;
    out += shown(text.substr(i, end - i));
    i = end;
  }
  return out;
}

std::string CheckpointNames::graph_name(std::string_view name) const {
  for (const auto& [param, display] : params_) {
    if (display == name) return param;
  }
  for (const auto& [prefix, display] : prefixes_) {
    if (name.starts_with(display) && name.size() > display.size() && name[display.size()] == '.')
      return prefix + std::string(name.substr(display.size()));
  }
  return std::string(name);
}

std::string CheckpointNames::legend() const {
  if (params_.empty()) return "";
  return "names as in the checkpoint: c_attn(q), c_attn(k), c_attn(v) are the q, k and v thirds of GPT-2's fused "
         "attn.c_attn (columns [0, H), [H, 2H), [2H, 3H) of its weight)\n";
}

}  // namespace shardwise::cli
