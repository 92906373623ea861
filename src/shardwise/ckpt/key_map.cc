#include "shardwise/ckpt/key_map.h"

#include <algorithm>
#include <set>

#include "shardwise/core/error.h"

namespace shardwise::ckpt {

reshard::Box KeyPlacement::part() const {
  reshard::Box b{{}, shape};
  if (is_slice()) {
    b.offset[0] = index;
    b.shape[0] = 1;
  }
  return b;
}

Region KeyPlacement::stored_region() const {
  Region r;
  if (is_slice()) {
    std::vector<int64_t> dims = {1};
    dims.insert(dims.end(), key_shape.begin(), key_shape.end());
    r.shape = Shape(std::span<const int64_t>(dims));
    r.origin[0] = index;
    return r;
  }
  r.shape = key_shape;
  for (size_t d = 0; d < offset.size(); ++d) r.origin[d] = -offset[d];
  return r;
}

reshard::Box KeyPlacement::to_key(const reshard::Box& box) const {
  reshard::Box out;
  if (is_slice()) {
    std::vector<int64_t> dims(box.shape.begin() + 1, box.shape.end());
    out.shape = Shape(std::span<const int64_t>(dims));
    for (int d = 1; d < box.shape.ndim(); ++d) out.offset[static_cast<size_t>(d - 1)] = box.offset[static_cast<size_t>(d)];
    return out;
  }
  out = box;
  for (size_t d = 0; d < offset.size(); ++d) out.offset[d] += offset[d];
  return out;
}

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
  entries_[name] = {KeyPlacement{key, key_shape, std::move(offset), shape, -1}};
}

void KeyMap::place_slices(const std::string& name, const Shape& shape, const std::vector<std::string>& keys) {
  SW_CHECK(!entries_.count(name), "key map: '{}' is placed twice", name);
  SW_CHECK(shape.ndim() >= 1 && static_cast<int64_t>(keys.size()) == shape[0],
           "key map: '{}' of shape {} cannot be stored as {} slices along dim 0", name, shape.to_string(), keys.size());
  SW_CHECK(std::set<std::string>(keys.begin(), keys.end()).size() == keys.size(),
           "key map: the slices of '{}' name a key twice", name);
  std::vector<int64_t> dims(shape.begin() + 1, shape.end());
  const Shape key_shape{std::span<const int64_t>(dims)};
  std::vector<KeyPlacement> out;
  for (size_t e = 0; e < keys.size(); ++e) {
    out.push_back(KeyPlacement{keys[e], key_shape, std::vector<int64_t>(dims.size(), 0), shape, static_cast<int64_t>(e)});
  }
  entries_[name] = std::move(out);
}

std::span<const KeyPlacement> KeyMap::placements(std::string_view name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? std::span<const KeyPlacement>() : std::span<const KeyPlacement>(it->second);
}

std::vector<const KeyPlacement*> KeyMap::parts_of(std::string_view key) const {
  std::vector<const KeyPlacement*> out;
  for (const auto& [name, ps] : entries_) {
    for (const KeyPlacement& p : ps)
      if (p.key == key) out.push_back(&p);
  }
  std::stable_sort(out.begin(), out.end(), [](const KeyPlacement* a, const KeyPlacement* b) { return a->offset < b->offset; });
  return out;
}

std::vector<std::string> KeyMap::names_of(std::string_view key) const {
  std::vector<std::pair<std::vector<int64_t>, std::string>> found;
  for (const auto& [name, ps] : entries_) {
    for (const KeyPlacement& p : ps)
      if (p.key == key) found.emplace_back(p.offset, name);
  }
  std::stable_sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> out;
  for (auto& [o, name] : found) out.push_back(std::move(name));
  return out;
}

void KeyMap::add(const KeyMap& other) {
  for (const auto& [name, ps] : other.entries_) {
    SW_CHECK(!entries_.count(name), "key map: '{}' is placed twice", name);
    entries_[name] = ps;
  }
}

KeyMap KeyMap::with_suffix(std::string_view suffix) const {
  KeyMap out;
  for (const auto& [name, ps] : entries_) {
    std::vector<KeyPlacement> moved = ps;
    for (KeyPlacement& p : moved) p.key += std::string(suffix);
    out.entries_[name + std::string(suffix)] = std::move(moved);
  }
  return out;
}

void KeyMap::check_tiling() const {
  std::map<std::string, std::vector<const KeyPlacement*>> by_key;
  for (const auto& [name, ps] : entries_) {
    for (const KeyPlacement& p : ps) by_key[p.key].push_back(&p);
  }
  for (const auto& [key, parts] : by_key) {
    int64_t covered = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      SW_CHECK(parts[i]->key_shape == parts[0]->key_shape, "key map: '{}' is declared with shapes {} and {}", key,
               parts[0]->key_shape.to_string(), parts[i]->key_shape.to_string());
      const reshard::Box bi = parts[i]->to_key(parts[i]->part());
      covered += bi.numel();
      for (size_t j = 0; j < i; ++j) {
        const reshard::Box bj = parts[j]->to_key(parts[j]->part());
        SW_CHECK(bi.shape.ndim() == bj.shape.ndim(), "key map: '{}' holds a slice and a fused tensor", key);
        SW_CHECK(reshard::intersect(bi, bj).numel() == 0,
                 "key map: two tensors placed in '{}' overlap (offsets [{}] and [{}])", key,
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
  for (const auto& [name, ps] : entries_) {
    const KeyPlacement& p = ps.front();
    if (p.is_slice()) {
      std::vector<std::string> keys;
      for (const KeyPlacement& s : ps) keys.push_back(s.key);
      j[name] = {{"shape", dims(p.shape)}, {"slices", keys}};
    } else {
      j[name] = {{"key", p.key}, {"offset", p.offset}, {"shape", dims(p.shape)}, {"key_shape", dims(p.key_shape)}};
    }
  }
  return j;
}

KeyMap KeyMap::from_json(const nlohmann::json& j) {
  KeyMap out;
  auto shape = [](const nlohmann::json& v) { return Shape(std::span<const int64_t>(v.get<std::vector<int64_t>>())); };
  for (const auto& [name, p] : j.items()) {
    if (p.contains("slices")) {
      out.place_slices(name, shape(p.at("shape")), p.at("slices").get<std::vector<std::string>>());
      continue;
    }
    out.place(name, shape(p.at("shape")), p.at("key").get<std::string>(), shape(p.at("key_shape")),
              p.at("offset").get<std::vector<int64_t>>());
  }
  return out;
}

}  // namespace shardwise::ckpt
