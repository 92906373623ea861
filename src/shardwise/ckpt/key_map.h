#pragma once
// Where a program's tensors lie in a checkpoint's files: one declared table from a tensor's name
// (a model parameter, "<param>/exp_avg", ...) to the file key that stores it and the box of that
// stored tensor it fills. A stored tensor may be fused from several named tensors (GPT-2's
// attn.c_attn holds q|k|v side by side); their boxes must tile it exactly. Tensors the table does
// not name are stored whole under their own name.
//
// The same table serves save (each rank writes its block straight into its box of the stored
// tensor: a tp shard of q is a sub-box of c_attn, so no rank writes another's bytes), load (each
// rank reads its block from the box), and the tools (inspect shows it from the manifest, merge and
// convert keep the keys and carry the table on). Boxes keep the named tensor's dim order: a
// transposed placement is not supported (models store parameters in their file layout).
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "shardwise/core/shape.h"

namespace shardwise::ckpt {

struct KeyPlacement {
  std::string key;              // the stored tensor
  Shape key_shape;              // its shape
  std::vector<int64_t> offset;  // where the named tensor's element [0, ..., 0] lies in it
  Shape shape;                  // the named tensor's shape
};

class KeyMap {
 public:
  // Declares that `name` (of `shape`) fills the box [offset, offset + shape) of `key`. Error when
  // the ranks differ, the box leaves the stored tensor, or `name` is declared twice.
  void place(const std::string& name, const Shape& shape, const std::string& key, const Shape& key_shape,
             std::vector<int64_t> offset);
  const KeyPlacement* find(std::string_view name) const;
  bool empty() const { return entries_.empty(); }
  const std::map<std::string, KeyPlacement, std::less<>>& entries() const { return entries_; }
  // The names that fill `key`, in order of their offset.
  std::vector<std::string> names_of(std::string_view key) const;
  // Adds every entry of `other` (Error on a name placed in both).
  void add(const KeyMap& other);
  // The same table for "<name><suffix>" stored in "<key><suffix>" (optimizer moments).
  KeyMap with_suffix(std::string_view suffix) const;
  // Error naming the key when the boxes of a stored tensor overlap or leave part of it uncovered.
  void check_tiling() const;

  // {"<name>": {"key", "offset", "shape", "key_shape"}}, as the manifest keeps it.
  nlohmann::json to_json() const;
  static KeyMap from_json(const nlohmann::json& j);

 private:
  std::map<std::string, KeyPlacement, std::less<>> entries_;
};

}  // namespace shardwise::ckpt
