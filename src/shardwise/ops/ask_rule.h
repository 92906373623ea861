#pragma once
// One question to an op's SPMD rule, as `shardwise infer` and the Python package ask it: given the
// op, a mesh, the inputs' shapes and dtypes, placements and attributes, which placements the rule
// requires of its inputs and which its outputs get. One function, so the CLI and Python give the
// same answers.
#include <string>
#include <vector>

#include "shardwise/core/attrs.h"
#include "shardwise/mesh/dist_attr.h"
#include "shardwise/mesh/process_mesh.h"
#include "shardwise/ops/op.h"
#include "shardwise/spmd/rule.h"

namespace shardwise::ops {

struct RuleQuestion {
  std::string op;
  std::string part = "forward";  // "forward", "reverse" or "grad"
  mesh::ProcessMesh mesh;
  std::vector<TensorMeta> inputs;
  // forward: one per input; reverse: one per output; grad: one per input, then one per output grad.
  std::vector<mesh::DistAttr> placements;
  Attrs attrs;
};

struct RuleAnswer {
  std::string op, part, rule;  // rule: the name of the rule the op holds
  // The tensors result.inputs / result.outputs describe: for forward and reverse, the op's inputs
  // and outputs; for grad, inputs ++ outputs ++ output grads, and the input gradients.
  std::vector<TensorMeta> required, produced;
  spmd::SpmdResult result;
};

// Error (naming the op and the count or tensor) when the placements do not match the op's inputs
// or outputs, a placement does not fit its tensor or the mesh, or the op has no gradient (grad).
RuleAnswer ask_rule(const RuleQuestion& question);

}  // namespace shardwise::ops
