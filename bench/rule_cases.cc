#include "bench/rule_cases.h"

namespace shardwise::bench {
namespace {

RuleCall make(const std::string& label, const std::string& op, std::vector<std::pair<Shape, std::string>> ins,
              Attrs attrs = {}) {
  RuleCall c{label, &ops::op_registry().get(op).rule, mesh::ProcessMesh(Shape{2, 4}), {}, attrs};
  for (auto& [shape, dist] : ins) c.inputs.push_back({shape, DType::F32, mesh::parse_dist(dist, 2)});
  return c;
}

// The gradient rule call for the same op: forward outputs take the forward rule's placements and
// the output grads the same placements.
RuleCall grad_of(RuleCall c, const std::string& op) {
  std::vector<ops::TensorMeta> metas;
  for (auto& in : c.inputs) metas.push_back({in.shape, in.dtype});
  auto outs = ops::infer_checked(ops::op_registry().get(op), metas, c.attrs);
  spmd::SpmdResult fwd = c.call();
  for (int twice = 0; twice < 2; ++twice) {
    for (size_t i = 0; i < outs.size(); ++i) c.inputs.push_back({outs[i].shape, outs[i].dtype, fwd.outputs[i]});
  }
  c.label = "grad " + c.label;
  c.grad = true;
  return c;
}

}  // namespace

std::vector<RuleCall> rule_calls() {
  RuleCall gelu = make("unary gelu [S(0),P(sum)]", "gelu", {{Shape{1024, 4096}, "S(0),P(sum)"}});
  RuleCall add = make("binary add broadcast [S(0),S(2)]+[R,S(0)]", "add",
                      {{Shape{8, 1024, 4096}, "S(0),S(2)"}, {Shape{4096}, "R,S(0)"}});
  RuleCall sum = make("reduction sum axis=[1] [S(0),S(1)]", "sum", {{Shape{1024, 4096}, "S(0),S(1)"}},
                      Attrs{{"axis", std::vector<int64_t>{1}}});
  RuleCall col = make("matmul column-parallel [S(0),R]x[R,S(1)]", "matmul",
                      {{Shape{8, 1024, 4096}, "S(0),R"}, {Shape{4096, 16384}, "R,S(1)"}});
  RuleCall row = make("matmul row-parallel [S(0),S(2)]x[R,S(0)]", "matmul",
                      {{Shape{8, 1024, 16384}, "S(0),S(2)"}, {Shape{16384, 4096}, "R,S(0)"}});
  RuleCall ln = make("layer_norm [S(0),S(1)] x 8x1024x4096", "layer_norm",
                     {{Shape{8, 1024, 4096}, "S(0),S(1)"}, {Shape{4096}, "R,R"}, {Shape{4096}, "R,R"}});
  RuleCall bn = make("batch_norm inference NCHW [S(0),S(1)]", "batch_norm",
                     {{Shape{32, 256, 56, 56}, "S(0),S(1)"}, {Shape{256}, "R,R"}, {Shape{256}, "R,R"},
                      {Shape{256}, "R,R"}, {Shape{256}, "R,R"}},
                     Attrs{{"training", false}});
  RuleCall sbn = make("sync_batch_norm training NCHW [S(0),S(2)]", "sync_batch_norm",
                      {{Shape{32, 256, 56, 56}, "S(0),S(2)"}, {Shape{256}, "R,R"}, {Shape{256}, "R,R"},
                       {Shape{256}, "R,R"}, {Shape{256}, "R,R"}});
  RuleCall put = make("index_put k=1 [R,S(1)]", "index_put",
                      {{Shape{4096, 1024}, "R,S(1)"}, {Shape{512}, "R,R"}, {Shape{512, 1024}, "R,S(1)"}});
  put.inputs[1].dtype = DType::I64;
  RuleCall reshape = make("reshape 1x512x4096 -> 1x2x256x4096 [S(1),S(2)]", "reshape",
                          {{Shape{1, 512, 4096}, "S(1),S(2)"}}, Attrs{{"shape", std::vector<int64_t>{1, 2, 256, 4096}}});
  return {gelu, add, sum, col, row, ln, bn, sbn, put, reshape, grad_of(gelu, "gelu"), grad_of(add, "add"),
          grad_of(sum, "sum"), grad_of(row, "matmul"), grad_of(ln, "layer_norm")};
}

}  // namespace shardwise::bench
