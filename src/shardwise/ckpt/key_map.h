#pragma once
// Where a program's tensors lie in a checkpoint's files: one declared table from a tensor's name
// (a model parameter, "<param>/exp_avg", ...) to the file keys that store it and the box of each
// stored tensor it fills. Two kinds of placement:
//   fused   the whole named tensor fills a box of one stored tensor of the same rank; several
//           named tensors may share the stored tensor (GPT-2's attn.c_attn holds q|k|v side by
//           side) and their boxes must tile it exactly;
//   slices  a stacked named tensor [E, ...] is kept as E stored tensors, slice e (its index e
//           along dim 0, without that dim) under the e-th key (Mixtral's experts: the parameter
//           experts.w1 [E, I, H] is stored as experts.0.w1.weight [I, H], ...).
// Tensors the table does not name are stored whole under their own name.
//
// Every placement is seen the same way by save and load: `part()`, the box of the named tensor the
// stored tensor holds, and `stored_region()`, the stored tensor as a row-major region in the named
// tensor's coordinates (a slice's key [I, H] is the region [1, I, H] at [e, 0, 0]; a fused key
// 6x18 holding q at [0, 6] is the region 6x18 at [0, -6]). Save writes each rank's block
// intersected with each part straight into its stored tensor (a tp shard of q is a sub-box of
// c_attn; an ep rank's experts are whole slices, so it writes only its experts' keys), load reads
// each rank's block from the parts it meets (an ep rank opens only its experts' keys), and the
// tools (inspect shows the table from the manifest, merge and convert keep the keys and carry the
// table on). Boxes keep the named tensor's dim order: a transposed placement is not supported.
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shardwise/ckpt/box_runs.h"
#include "shardwise/core/shape.h"

namespace shardwise::ckpt {

struct KeyPlacement {
  std::string key;              // the stored tensor
  Shape key_shape;              // its shape
  std::vector<int64_t> offset;  // fused: where the named tensor's element [0, ..., 0] lies in it
  Shape shape;                  // the named tensor's shape
  int64_t index = -1;           // slices: which slice along dim 0 the key holds; -1: fused

  bool is_slice() const { return index >= 0; }
  // The box of the named tensor this key holds.
  reshard::Box part() const;
  // The stored tensor as a region in the named tensor's coordinates (box_runs.h).
  Region stored_region() const;
  // A box of the named tensor inside part(), in the stored tensor's coordinates (a slice drops dim 0).
  reshard::Box to_key(const reshard::Box& box) const;
};

class KeyMap {
 public:
  // Declares that `name` (of `shape`) fills the box [offset, offset + shape) of `key`. Error when
  // the ranks differ, the box leaves the stored tensor, or `name` is declared twice.
  void place(const std::string& name, const Shape& shape, const std::string& key, const Shape& key_shape,
             std::vector<int64_t> offset);
  // Declares that `name` (of `shape`, rank >= 1) is stored as shape[0] tensors, slice e under
  // keys[e] with shape shape[1:]. Error when keys.size() != shape[0], a key repeats, or `name` is
  // declared twice.
  void place_slices(const std::string& name, const Shape& shape, const std::vector<std::string>& keys);
  // Where `name` is stored: one fused placement, shape[0] slices, or none (stored whole under its name).
  std::span<const KeyPlacement> placements(std::string_view name) const;
  bool empty() const { return entries_.empty(); }
  const std::map<std::string, std::vector<KeyPlacement>, std::less<>>& entries() const { return entries_; }
  // The placements that fill `key`, in order of their offset.
  std::vector<const KeyPlacement*> parts_of(std::string_view key) const;
  // The names that fill `key`, in order of their offset.
  std::vector<std::string> names_of(std::string_view key) const;
  // Adds every entry of `other` (Error on a name placed in both).
  void add(const KeyMap& other);
  // The same table for "<name><suffix>" stored in "<key><suffix>" (optimizer moments).
  KeyMap with_suffix(std::string_view suffix) const;
  // Error naming the key when the boxes of a stored tensor overlap or leave part of it uncovered.
  void check_tiling() const;

  // Fused: {"<name>": {"key", "offset", "shape", "key_shape"}}; slices: {"<name>": {"shape",
  // "slices": ["<key of slice 0>", ...]}}, as the manifest keeps it.
  nlohmann::json to_json() const;
  static KeyMap from_json(const nlohmann::json& j);

 private:
  std::map<std::string, std::vector<KeyPlacement>, std::less<>> entries_;
};

}  // namespace shardwise::ckpt
