#include "shardwise/ckpt/key_map.h"

#include <algorithm>

#include "shardwise/core/error.h"

namespace shardwise::ckpt {

void KeyMap::place(const std::string& name, const Shape& shape, const std::string& key, const Shape& key_shape,
                   std::vector<int64_t> offset) {
  SW_CHECK(!entries_.count(name), "key map: '{}' is placed twice", name);
  SW_CHECK(shape.ndim() == key_shape.ndim() && static_cast<int>(offset.size()) == shape.ndim(),
           "key map: '{}' of shape {} cannot be placed at offset [{}] of '{}' {}: the ranks differ", name,
           shape.to_string(), fmt::join(offset, ","), key, key_shape.to_string());
  for (int d = 0; d < shape.ndim(); ++d) {
    const auto o = offset[static_cast<size_t>(d)];
    SW_CHECK(o >= 0 && o + shape[d] <= key_shape[d],
             "key map: '{}' of shape {} at offset [{}] leaves '{}' {} on dim {}", name, shape.to_string(),
             fmt::join(offset, ","), key, key_shape.to_string(), d);
  }
  entries_[name] = {key, key_shape, std::move(offset), shape};
}

const KeyPlacement* KeyMap::find(std::string_view name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

std::vector<std::string> KeyMap::names_of(std::string_view key) const {
  std::vector<std::string> out;
  for (const auto& [name, p] : entries_) {
    if (p.key == key) out.push_back(name);
  }
  std::sort(out.begin(), out.end(), [&](const std::string& a, const std::string& b) {
    return entries_.find(a)->second.offset < entries_.find(b)->second.offset;
  });
  return out;
}

void KeyMap::add(const KeyMap& other) {
  for (const auto& [name, p] : other.entries_) place(name, p.shape, p.key, p.key_shape, p.offset);
}

KeyMap KeyMap::with_suffix(std::string_view suffix) const {
  KeyMap out;
  for (const auto& [name, p] : entries_) {
    out.entries_[name + std::string(suffix)] = {p.key + std::string(suffix), p.key_shape, p.offset, p.shape};
  }
  return out;
}

void KeyMap::check_tiling() const {
  std::map<std::string, std::vector<const KeyPlacement*>> by_key;
  for (const auto& [name, p] : entries_) by_key[p.key].push_back(&p);
  for (const auto& [key, parts] : by_key) {
    int64_t covered = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      SW_CHECK(parts[i]->key_shape == parts[0]->key_shape, "key map: '{}' is declared with shapes {} and {}", key,
               parts[0]->key_shape.to_string(), parts[i]->key_shape.to_string());
      covered += parts[i]->shape.numel();
      for (size_t j = 0; j < i; ++j) {
        bool overlap = true;
        for (int d = 0; d < parts[i]->shape.ndim(); ++d) {
          const auto a = parts[i]->offset[static_cast<size_t>(d)], b = parts[j]->offset[static_cast<size_t>(d)];
          overlap = overlap && a < b + parts[j]->shape[d] && b < a + parts[i]->shape[d];
        }
        SW_CHECK(!overlap, "key map: two tensors placed in '{}' overlap (offsets [{}] and [{}])", key,
                 fmt::join(parts[i]->offset, ","), fmt::join(parts[j]->offset, ","));
      }
    }
    SW_CHECK(covered == parts[0]->key_shape.numel(),
             "key map: the tensors placed in '{}' {} cover {} of its {} elements", key,
             parts[0]->key_shape.to_string(), covered, parts[0]->key_shape.numel());
  }
}

nlohmann::json KeyMap::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  auto dims = [](const Shape& s) { return std::vector<int64_t>(s.begin(), s.end()); };
  for (const auto& [name, p] : entries_) {
    j[name] = {{"key", p.key}, {"offset", p.offset}, {"shape", dims(p.shape)}, {"key_shape", dims(p.key_shape)}};
  }
  return j;
}

KeyMap KeyMap::from_json(const nlohmann::json& j) {
  KeyMap out;
  auto shape = [](const nlohmann::json& v) { return Shape(std::span<const int64_t>(v.get<std::vector<int64_t>>())); };
  for (const auto& [name, p] : j.items()) {
    out.place(name, shape(p.at("shape")), p.at("key").get<std::string>(), shape(p.at("key_shape")),
              p.at("offset").get<std::vector<int64_t>>());
  }
  return out;
}

}  // namespace shardwise::ckpt
