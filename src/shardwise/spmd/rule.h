#pragma once
// SPMD sharding rules: pure functions from global shapes, dtypes, distributions and attributes
// to the distributions the inputs must be resharded to and the distributions of the outputs.
//
// Every rule has three parts:
//  - forward(mesh, inputs, attrs): inputs carry their current distributions; returns the required
//    input distributions (a reshard is needed wherever they differ) and the output distributions.
//  - reverse(mesh, inputs, outputs, attrs): the outputs carry the wanted distributions (the
//    inputs' are advisory); returns input and output distributions that are consistent with
//    each other (running the op on inputs laid out as returned yields outputs laid out as returned).
//  - grad(mesh, grad_inputs, attrs): grad_inputs = forward inputs ++ forward outputs ++ output
//    gradients (in that order, each with its distribution); returns the required distribution of
//    every grad input, and as outputs the distribution of each forward input's gradient.
// A rule never silently replicates everything: when inputs disagree it picks a documented winner.
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shardwise/core/attrs.h"
#include "shardwise/core/dtype.h"
#include "shardwise/core/shape.h"
#include "shardwise/mesh/dist_attr.h"
#include "shardwise/mesh/process_mesh.h"

namespace shardwise::spmd {

using mesh::DistAttr;
using mesh::MeshDimList;
using mesh::Placement;
using mesh::ProcessMesh;
using mesh::ReduceOp;

struct TensorSpec {
  Shape shape;
  DType dtype = DType::F32;
  DistAttr dist;
};

struct SpmdResult {
  std::vector<DistAttr> inputs;   // required distribution of each input
  std::vector<DistAttr> outputs;  // distribution of each output
};

using ForwardRule =
    std::function<SpmdResult(const ProcessMesh&, std::span<const TensorSpec> inputs, const Attrs&)>;
using ReverseRule = std::function<SpmdResult(const ProcessMesh&, std::span<const TensorSpec> inputs,
                                             std::span<const TensorSpec> outputs, const Attrs&)>;

// An op's rule. Ops hold their rule directly (ops::OpDef::rule); several ops may share one
// (every non-linear unary op has elementwise_unary), and `name` says which.
struct Rule {
  std::string name;     // e.g. "elementwise_unary"
  std::string summary;  // one line: what it requires of the inputs and what it produces
  ForwardRule forward;
  ReverseRule reverse;
  ForwardRule grad;
};

// A rule whose three parts take the rule's name (for their messages) first: one implementation
// shared by several rules (batch_norm / sync_batch_norm, cross_entropy / its vocab-parallel form).
// `name` must outlive the rule (a string literal or a constant): the parts keep a view of it.
using NamedForwardRule = SpmdResult (*)(std::string_view name, const ProcessMesh&, std::span<const TensorSpec>,
                                        const Attrs&);
using NamedReverseRule = SpmdResult (*)(std::string_view name, const ProcessMesh&, std::span<const TensorSpec>,
                                        std::span<const TensorSpec>, const Attrs&);
Rule named_rule(std::string_view name, std::string summary, NamedForwardRule forward,
                NamedReverseRule reverse, NamedForwardRule grad);

// P(sum) or P(avg): the Partials that pass through an op linear in that operand.
inline bool is_linear_partial(const Placement& p) {
  return p.is_partial(ReduceOp::Sum) || p.is_partial(ReduceOp::Avg);
}

// Checks that every input distribution is valid for its tensor on `mesh` (rank of the tensor,
// mesh dims count); throws an Error naming the input. Rules call this first.
void check_inputs(std::string_view rule, const ProcessMesh& mesh, std::span<const TensorSpec> inputs,
                  size_t expected_count);

}  // namespace shardwise::spmd
