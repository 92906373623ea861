#pragma once
// Representative rule calls on a 2-D mesh [2,4], shared by the benchmark and the callgrind driver.
#include <string>
#include <vector>

#include "shardwise/ops/op.h"

namespace shardwise::bench {

struct RuleCall {
  std::string label;
  const spmd::Rule* rule;
  mesh::ProcessMesh mesh;
  std::vector<spmd::TensorSpec> inputs;
  Attrs attrs;
  bool grad = false;  // call the gradient rule (inputs = x.., out.., dout..) instead of forward
  spmd::SpmdResult call() const {
    return grad ? rule->grad(mesh, inputs, attrs) : rule->forward(mesh, inputs, attrs);
  }
};

std::vector<RuleCall> rule_calls();

}  // namespace shardwise::bench
