#pragma once
// Placement of a tensor on one mesh dim: Replicate, Shard(tensor dim), or Partial(reduce op).
#include <cstdint>
#include <string>
#include <string_view>

namespace shardwise::mesh {

enum class ReduceOp : uint8_t { Sum, Avg, Max, Min };
std::string_view reduce_op_name(ReduceOp op);  // "sum", "avg", "max", "min"
ReduceOp parse_reduce_op(std::string_view text);

struct Placement {
  enum class Kind : uint8_t { Replicate, Shard, Partial };
  Kind kind = Kind::Replicate;
  int8_t dim = -1;               // tensor dim, for Shard
  ReduceOp reduce = ReduceOp::Sum;  // for Partial

  static constexpr Placement replicate() { return {}; }
  static constexpr Placement shard(int tensor_dim) {
    return {Kind::Shard, static_cast<int8_t>(tensor_dim), ReduceOp::Sum};
  }
  static constexpr Placement partial(ReduceOp op = ReduceOp::Sum) { return {Kind::Partial, -1, op}; }

  bool is_replicate() const { return kind == Kind::Replicate; }
  bool is_shard() const { return kind == Kind::Shard; }
  bool is_shard(int tensor_dim) const { return kind == Kind::Shard && dim == tensor_dim; }
  bool is_partial() const { return kind == Kind::Partial; }
  bool is_partial(ReduceOp op) const { return kind == Kind::Partial && reduce == op; }

  std::string to_string() const;  // "R", "S(0)", "P(sum)"
  friend bool operator==(const Placement& a, const Placement& b) {
    if (a.kind != b.kind) return false;
    if (a.kind == Kind::Shard) return a.dim == b.dim;
    if (a.kind == Kind::Partial) return a.reduce == b.reduce;
    return true;
  }
};

// Parses "R", "S(0)", "Shard(0)", "P", "P(sum)", "Partial(max)" (case-insensitive first letter).
Placement parse_placement(std::string_view text);

}  // namespace shardwise::mesh
