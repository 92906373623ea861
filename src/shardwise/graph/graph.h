#pragma once
// The program IR: values (global shape, dtype, distribution once completion has run) and nodes
// (an op of the op registry with its inputs, outputs and attributes). Models are written with
// single-device semantics through the builder methods; parameters and inputs are named, and the
// names are stable (they become checkpoint keys).
//
// Node kinds:
//   Forward   an op of the registry: outputs = op(inputs).
//   Backward  the gradient of one forward node: inputs = the forward node's inputs ++ its outputs
//             ++ one gradient per forward output; outputs = one gradient per forward input (-1
//             where the input takes none). Its kernel is the op's backward kernel, its SPMD rule
//             the op's grad rule: a gradient is one node, proven by the verifier like the op.
//   Fill      a constant tensor (zeros, ones) of a given shape: autodiff's seed and the gradients
//             of outputs nothing reads.
//
// Recompute segments (graph/recompute.h): forward nodes added between begin_segment() and
// end_segment() carry that segment's id; their values are recomputed for the backward instead of
// kept (activation recompute).
#include <optional>
#include <unordered_map>
#include <string>
#include <vector>

#include "shardwise/core/attrs.h"
#include "shardwise/mesh/dist_attr.h"
#include "shardwise/ops/op.h"

namespace shardwise::graph {

using ValueId = int;
using NodeId = int;

// Frozen: a parameter held fixed (LoRA's base weights): a leaf bound like a parameter, read by the
// kernels, that takes no gradient (autodiff never differentiates it) and is not in params().
enum class ValueKind { Input, Param, Frozen, Activation, Grad };
std::string_view value_kind_name(ValueKind kind);

struct Value {
  ValueId id = -1;
  std::string name;  // unique in the graph
  ops::TensorMeta meta;
  ValueKind kind = ValueKind::Activation;
  NodeId producer = -1;  // -1 for inputs and parameters
  int producer_output = 0;
  std::optional<mesh::DistAttr> annotation;  // set by the user; completion never overrides it
  bool requires_grad = false;                // parameters, and values computed from them
  ValueId grad = -1;                         // after autodiff: the value holding d(loss)/d(this)
  ValueId recompute_copy = -1;  // after apply_recompute: the copy the backward reads instead of this
};

enum class NodeKind { Forward, Backward, Fill };

struct Node {
  NodeId id = -1;
  NodeKind kind = NodeKind::Forward;
  std::string op;  // registry op name (Backward: the forward op's name; Fill: "fill")
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;  // Backward: -1 where a forward input takes no gradient
  Attrs attrs;                   // Fill: "value" (float)
  NodeId forward = -1;           // Backward: the forward node it differentiates
  int segment = -1;              // Forward: the recompute segment it belongs to (-1: none)
  NodeId recomputes = -1;        // a recompute copy (graph/recompute.h): the forward node it repeats
  std::string to_string(const class Graph& g) const;  // "h = matmul(x, w1)"
};

class Graph {
 public:
  // Leaves. Names must be unique; a bad name or shape is an Error naming it.
  ValueId input(std::string name, const Shape& shape, DType dtype = DType::F32);
  ValueId param(std::string name, const Shape& shape, DType dtype = DType::F32);
  ValueId frozen(std::string name, const Shape& shape, DType dtype = DType::F32);  // a frozen parameter

  // Any registered op; returns its outputs. Shapes are inferred now: a mismatch is an Error that
  // names the node and its input values. Output names: `name` (or "<op>_<node id>") plus ":k"
  // for outputs after the first.
  std::vector<ValueId> op(std::string_view op_name, std::vector<ValueId> inputs, Attrs attrs = {},
                          std::string name = {});
  ValueId op1(std::string_view op_name, std::vector<ValueId> inputs, Attrs attrs = {}, std::string name = {});

  // Builder shorthands for the ops models use most (each is op1/op with the op's attributes).
  ValueId matmul(ValueId x, ValueId y, bool trans_y = false, std::string name = {});
  ValueId add(ValueId x, ValueId y, std::string name = {});
  ValueId multiply(ValueId x, ValueId y, std::string name = {});
  ValueId gelu(ValueId x, std::string name = {});
  ValueId relu(ValueId x, std::string name = {});
  ValueId scale(ValueId x, double scale, double bias = 0.0, std::string name = {});
  ValueId sum(ValueId x, std::vector<int64_t> axis = {}, bool keepdim = false, std::string name = {});
  ValueId mean(ValueId x, std::vector<int64_t> axis = {}, bool keepdim = false, std::string name = {});
  ValueId softmax(ValueId x, int64_t axis = -1, std::string name = {});
  ValueId layer_norm(ValueId x, ValueId scale, ValueId bias, int64_t begin_norm_axis = -1, double epsilon = 1e-5,
                     std::string name = {});
  ValueId embedding(ValueId ids, ValueId weight, std::string name = {});
  ValueId reshape(ValueId x, std::vector<int64_t> shape, std::string name = {});
  ValueId transpose(ValueId x, std::vector<int64_t> perm, std::string name = {});
  ValueId cross_entropy(ValueId logits, ValueId labels, std::string reduction = "mean", std::string name = {});

  // Distribution annotation of a value (inputs and parameters usually). Validated against the
  // value's rank now and against the mesh at completion.
  void annotate(ValueId v, const mesh::DistAttr& dist);
  void annotate(ValueId v, std::string_view placements);

  const Value& value(ValueId v) const;
  Value& value(ValueId v);
  const Node& node(NodeId n) const;
  Node& node(NodeId n);
  const std::vector<Value>& values() const { return values_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  std::optional<ValueId> find(std::string_view name) const;
  ValueId get(std::string_view name) const;  // Error naming near names when absent
  std::vector<ValueId> params() const;       // the trainable parameters, in creation order
  std::vector<ValueId> frozen_params() const;  // the frozen ones, in creation order
  std::vector<ValueId> inputs() const;

  // Recompute segments: every forward node added until end_segment() belongs to a new segment,
  // whose id begin_segment() returns. Segments do not nest.
  int begin_segment();
  void end_segment();
  int open_segment() const { return open_segment_; }

  // Low-level, for autodiff and passes: adds a node whose output metas are given.
  NodeId add_node(Node node, const std::vector<ops::TensorMeta>& output_metas, ValueKind output_kind,
                  const std::vector<std::string>& output_names);
  std::string unique_name(std::string base) const;

 private:
  ValueId new_value(std::string name, ops::TensorMeta meta, ValueKind kind);
  std::vector<Value> values_;
  std::vector<Node> nodes_;
  std::unordered_map<std::string, ValueId> by_name_;
  int open_segment_ = -1, segments_ = 0;
};

}  // namespace shardwise::graph
