#include "shardwise/ops/ask_rule.h"

#include <fmt/format.h>

#include "shardwise/core/error.h"

namespace shardwise::ops {
namespace {

std::vector<spmd::TensorSpec> specs_of(const std::vector<TensorMeta>& metas, const RuleQuestion& q, size_t first,
                                       const char* what) {
  std::vector<spmd::TensorSpec> specs;
  for (size_t i = 0; i < metas.size(); ++i) {
    const mesh::DistAttr& dist = q.placements[first + i];
    dist.validate(metas[i].shape.ndim(), q.mesh.ndim(), fmt::format("{} {} ({})", what, i, metas[i].shape.to_string()));
    specs.push_back({metas[i].shape, metas[i].dtype, dist});
  }
  return specs;
}

}  // namespace

RuleAnswer ask_rule(const RuleQuestion& q) {
  const OpDef& op = op_registry().get(q.op);
  SW_CHECK(q.part == "forward" || q.part == "reverse" || q.part == "grad",
           "part '{}' is not one of forward, reverse, grad", q.part);
  SW_CHECK(op.num_inputs < 0 || static_cast<int>(q.inputs.size()) == op.num_inputs, "op '{}' takes {} inputs but {} given",
           op.name, op.num_inputs, q.inputs.size());
  std::vector<TensorMeta> outputs = infer_checked(op, q.inputs, q.attrs);
  RuleAnswer a{op.name, q.part, op.rule.name, q.inputs, outputs, {}};
  if (q.part == "forward") {
    SW_CHECK(q.placements.size() == q.inputs.size(), "op '{}': {} placements for {} inputs", op.name,
             q.placements.size(), q.inputs.size());
    a.result = op.rule.forward(q.mesh, specs_of(q.inputs, q, 0, "input"), q.attrs);
  } else if (q.part == "reverse") {
    SW_CHECK(q.placements.size() == outputs.size(), "op '{}' (reverse): {} placements for {} outputs", op.name,
             q.placements.size(), outputs.size());
    std::vector<spmd::TensorSpec> in_specs;
    for (const auto& m : q.inputs) in_specs.push_back({m.shape, m.dtype, mesh::DistAttr(q.mesh.ndim())});
    a.result = op.rule.reverse(q.mesh, in_specs, specs_of(outputs, q, 0, "output"), q.attrs);
  } else {
    // The inputs' placements, then the output grads'; the outputs take the forward rule's.
    SW_CHECK(op.has_backward(), "op '{}' has no gradient", op.name);
    SW_CHECK(q.placements.size() == q.inputs.size() + outputs.size(),
             "op '{}' (grad): {} placements; expected {} (inputs, then output grads)", op.name, q.placements.size(),
             q.inputs.size() + outputs.size());
    std::vector<spmd::TensorSpec> specs = specs_of(q.inputs, q, 0, "input");
    spmd::SpmdResult fwd = op.rule.forward(q.mesh, specs, q.attrs);
    for (size_t i = 0; i < outputs.size(); ++i) specs.push_back({outputs[i].shape, outputs[i].dtype, fwd.outputs[i]});
    auto grads = specs_of(outputs, q, q.inputs.size(), "output grad");
    specs.insert(specs.end(), grads.begin(), grads.end());
    a.result = op.rule.grad(q.mesh, specs, q.attrs);
    a.required.insert(a.required.end(), outputs.begin(), outputs.end());
    a.required.insert(a.required.end(), outputs.begin(), outputs.end());
    a.produced = q.inputs;
  }
  return a;
}

}  // namespace shardwise::ops
