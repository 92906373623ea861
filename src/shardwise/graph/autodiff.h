#pragma once
// Reverse-mode autodiff on the graph: appends, after the forward nodes, one Backward node per
// forward node on a path from a parameter to the loss (the op's analytic gradient), Fill nodes for
// the seed d(loss)/d(loss) = 1 and for outputs nothing differentiates (zeros), and `add` nodes
// where a value is used more than once (contributions summed in the order of their consumers).
// The gradient of value "x" is named "x@grad".
#include "shardwise/graph/graph.h"

namespace shardwise::graph {

struct AutodiffOptions {
  // A parameter the loss does not depend on is an Error (it would never train) unless allowed.
  bool allow_unused_params = false;
  // The gradient of `loss` is this value (an input shaped like it) instead of 1: a pipeline stage
  // differentiates its output with the gradient the next stage sends back. The "loss" may then be
  // any floating tensor.
  ValueId seed = -1;
  // Floating scalars added to the loss: each gets d/d(itself) = 1 as well (a pipeline stage's own
  // terms of the loss, e.g. its MoE layers' router losses, beside the gradient of its output).
  std::vector<ValueId> extra_losses;
  // A node whose op has a partial gradient kernel (OpDef::backward_partial) and that gives both
  // parameters and other values a gradient gets two Backward nodes: one for the other values'
  // gradients, one for the parameters' (zero-bubble schedules run them at different times).
  bool split_param_grads = false;
};

// Appends the backward graph of the scalar `loss` (or of `loss` seeded with options.seed); sets
// Value::grad of every value that takes one, inputs marked requires_grad included (a pipeline
// stage's input). Returns the gradients of the parameters in Graph::params() order (-1 for unused
// ones when allowed).
std::vector<ValueId> append_backward(Graph& g, ValueId loss, const AutodiffOptions& options = {});

}  // namespace shardwise::graph
