#include "bench/rule_cases.h"

namespace shardwise::bench {
namespace {

RuleCall make(const std::string& label, const std::string& op, std::vector<std::pair<Shape, std::string>> ins,
              Attrs attrs = {}) {
  RuleCall c{label, &spmd::rules().get(ops::op_registry().get(op).rule), mesh::ProcessMesh(Shape{2, 4}), {}, attrs};
  for (auto& [shape, dist] : ins) c.inputs.push_back({shape, DType::F32, mesh::parse_dist(dist, 2)});
  return c;
}

}  // namespace

std::vector<RuleCall> rule_calls() {
  return {
      make("unary gelu [S(0),P(sum)]", "gelu", {{Shape{1024, 4096}, "S(0),P(sum)"}}),
      make("binary add broadcast [S(0),S(1)]+[R,S(0)]", "add", {{Shape{8, 1024, 4096}, "S(0),S(2)"}, {Shape{4096}, "R,S(0)"}}),
      make("reduction sum axis=[1] [S(0),S(1)]", "sum", {{Shape{1024, 4096}, "S(0),S(1)"}}, Attrs{{"axis", std::vector<int64_t>{1}}}),
      make("matmul column-parallel [S(0),R]x[R,S(1)]", "matmul", {{Shape{8, 1024, 4096}, "S(0),R"}, {Shape{4096, 16384}, "R,S(1)"}}),
      make("matmul row-parallel [S(0),S(2)]x[R,S(0)]", "matmul", {{Shape{8, 1024, 16384}, "S(0),S(2)"}, {Shape{16384, 4096}, "R,S(0)"}}),
  };
}

}  // namespace shardwise::bench
