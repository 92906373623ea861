#include "shardwise/mesh/placement.h"

#include <cctype>
#include <charconv>

#include "shardwise/core/error.h"

namespace shardwise::mesh {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

ReduceOp parse_reduce_op(std::string_view t) {
  if (t == "sum") return ReduceOp::Sum;
  if (t == "avg" || t == "mean") return ReduceOp::Avg;
  if (t == "max") return ReduceOp::Max;
  if (t == "min") return ReduceOp::Min;
  fail("unknown reduce op '{}': expected sum, avg, max or min", t);
}

std::string Placement::to_string() const {
  switch (kind) {
    case Kind::Replicate: return "R";
    case Kind::Shard: return "S(" + std::to_string(dim) + ")";
    case Kind::Partial: return "P(" + std::string(reduce_op_name(reduce)) + ")";
  }
  return "?";
}

Placement parse_placement(std::string_view text) {
  std::string_view t = text;
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.front()))) t.remove_prefix(1);
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.remove_suffix(1);
  SW_CHECK(!t.empty(), "empty placement: expected R, S(dim) or P(sum|avg|max|min)");
  std::string_view head = t.substr(0, t.find('('));
  std::string_view arg;
  if (head.size() < t.size()) {
    SW_CHECK(t.back() == ')', "cannot read placement '{}': missing ')'", text);
    arg = t.substr(head.size() + 1, t.size() - head.size() - 2);
  }
  auto is = [&](std::string_view a, std::string_view b) { return head == a || head == b; };
  if (is("R", "Replicate") || head == "r") {
    SW_CHECK(arg.empty(), "placement '{}': Replicate takes no argument", text);
    return Placement::replicate();
  }
  if (is("S", "Shard") || head == "s") {
    int dim = -1;
    auto [p, ec] = std::from_chars(arg.data(), arg.data() + arg.size(), dim);
    SW_CHECK(ec == std::errc() && p == arg.data() + arg.size() && dim >= 0 && dim < 127,
             "placement '{}': Shard needs a tensor dim, as in S(0)", text);
    return Placement::shard(dim);
  }
  if (is("P", "Partial") || head == "p") {
    return Placement::partial(arg.empty() ? ReduceOp::Sum : parse_reduce_op(arg));
  }
  fail("cannot read placement '{}': expected R, S(dim) or P(sum|avg|max|min)", text);
}

}  // namespace shardwise::mesh
