#pragma once
// The op registry: everything about an op in one entry — shape inference, reference CPU kernel,
// analytic gradient kernel, its SPMD rule, and the cases the numerical verifier runs. Each op
// family lives in one folder, ops/<family>/ (kernels, rules, registry entries); ops/builtin.cc
// registers every family with one call each.
#include <array>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shardwise/comm/communicator.h"
#include "shardwise/core/attrs.h"
#include "shardwise/spmd/rule.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::ops {

struct TensorMeta {
  Shape shape;
  DType dtype = DType::F32;
};

// Output shapes and dtypes from input shapes and dtypes; Error on a mismatch, naming the op.
using InferFn = std::function<std::vector<TensorMeta>(std::span<const TensorMeta> inputs, const Attrs&)>;
// The CPU kernel: also the local kernel each rank runs on its shards.
using KernelFn = std::function<std::vector<Tensor>(std::span<const Tensor> inputs, const Attrs&)>;
// Analytic gradient: one tensor per forward input (undefined for an input that takes no
// gradient, such as an integer index or a boolean condition).
using BackwardFn = std::function<std::vector<Tensor>(std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                                                     std::span<const Tensor> out_grads, const Attrs&)>;
// The gradients of the inputs with wanted[k] set only (the others undefined): lets a schedule
// compute input and weight gradients at different times without computing either twice.
using PartialBackwardFn =
    std::function<std::vector<Tensor>(std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                                      std::span<const Tensor> out_grads, const Attrs&, std::span<const bool> wanted)>;

// Where a kernel's local tensors sit in the global ones. The runtime and the verifier pass it to
// kernels that need global coordinates: vocab-parallel embedding (its shard's vocab offset),
// dropout (the global element index keys the counter-based generator). For a single-device call
// every global shape equals the local one and every offset is 0.
struct ShardInfo {
  Shape global_shape;
  std::array<int64_t, kMaxDims> offset{};
  mesh::DistAttr dist;  // the tensor's distribution (empty: single device)
};
struct KernelContext {
  // Forward: one entry per input. Backward: inputs ++ outputs ++ output grads.
  std::vector<ShardInfo> tensors;
  // For ops marked `collective`: this rank's communicators along mesh dims (null on one device:
  // a kernel then behaves as if every group had one rank).
  comm::MeshComm* mesh_comm = nullptr;
  // Random ops (dropout) key their draws by the global element index; the trainer adds the
  // micro-batch's first sample index to dim 0 here, so a sample draws the same mask whatever
  // micro-batch or mesh it is in, and every step (new samples) draws new masks. 0 elsewhere.
  int64_t sample_offset = 0;
  static KernelContext single_device(std::span<const Tensor> tensors);
  // For collective kernels: the group along the mesh dims (in mesh-dim order) on which
  // tensors[index] is sharded on a tensor dim whose bit is set in `tensor_dims`; null without a
  // communicator or without such a mesh dim (the kernel then runs as on one device). A Partial
  // placement of that tensor is an Error naming `op`: these kernels reduce statistics of their
  // shards, so a partial value is never a valid input.
  comm::Communicator* group_sharding(size_t index, uint32_t tensor_dims, std::string_view op) const;
};
using ContextKernelFn =
    std::function<std::vector<Tensor>(std::span<const Tensor> inputs, const Attrs&, const KernelContext&)>;
using ContextBackwardFn = std::function<std::vector<Tensor>(std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                                                            std::span<const Tensor> out_grads, const Attrs&,
                                                            const KernelContext&)>;

// How the verifier draws an input's values.
struct ValueGen {
  enum class Kind {
    Uniform,    // uniform real in [lo, hi) (integers: uniform integer in [lo, hi])
    SmallInts,  // integers in [lo, hi] stored in the input dtype: ties are frequent (max/min ties)
    Index,      // integers in [lo, hi] for index inputs
  };
  Kind kind = Kind::Uniform;
  double lo = -2.0;
  double hi = 2.0;
};

// One verification case: input shapes, dtypes, attributes and value generators (one per input;
// a missing generator means Uniform[-2, 2)). Provide cases whose dims divide every test mesh
// (use multiples of 12), dims that do not (5, 7), and a dim smaller than the mesh (1 or 2).
struct VerifyCase {
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
  Attrs attrs;
  std::vector<ValueGen> values;
};

struct OpDef {
  std::string name;
  std::string family;  // the folder ops/<family>/ that defines it
  spmd::Rule rule;     // its SPMD rule (forward, reverse, grad); several ops may share one
  std::string summary;
  int num_inputs = 1;   // fixed arity, or -1: any number >= 1 (concat, stack, index_put)
  int num_outputs = 1;  // fixed, or -1: as many as shape inference returns (split)
  InferFn infer;
  KernelFn forward;
  BackwardFn backward;  // empty when the op has no gradient
  std::vector<VerifyCase> cases;
  // Kernels that need global coordinates set these instead of (or besides) forward/backward;
  // when set they are used. Call ops through run_forward / run_backward below.
  ContextKernelFn forward_in_context;
  ContextBackwardFn backward_in_context;
  // Its context kernels call collectives (sync_batch_norm, vocab-parallel cross-entropy): the
  // verifier and the runtime run its ranks concurrently with a communicator in the context.
  bool collective = false;
  // Which forward tensors the gradient kernel reads the values of, as indices into inputs ++
  // outputs; the others it reads the shape of only (a stand-in of the right shape will do).
  // Unset: it may read all of them. A pipeline stage keeps only these between a micro-batch's
  // forward and its backward.
  std::optional<std::vector<int>> backward_reads;
  // Optional: backward_reads for a node's attributes where they decide it (the fused LM head reads
  // neither h nor W when its forward formed both gradients). Set, it replaces backward_reads.
  std::function<std::vector<int>(const Attrs&)> backward_reads_for;
  // Optional: gradients of a subset of the inputs (see PartialBackwardFn).
  PartialBackwardFn backward_partial;
  // Outputs from this index on carry no gradient (by-products the backward reads as values, such as
  // the fused LM head's gradients formed in its forward): where nothing else gives them one,
  // autodiff puts the output itself in its gradient slot (never read) instead of a zero fill of its
  // size. -1: every output takes a gradient.
  int grad_outputs = -1;
  bool has_backward() const { return backward || backward_in_context; }
  // Whether the gradient kernel reads the value of forward tensor k (index into inputs ++ outputs).
  bool backward_reads_value(int k, const Attrs& attrs) const;
};

class OpRegistry {
 public:
  void add(OpDef op);  // Error on duplicates or missing parts
  const OpDef& get(std::string_view name) const;  // Error listing near names
  const OpDef* find(std::string_view name) const;
  std::vector<const OpDef*> all() const;  // sorted by family, then name
  size_t size() const { return ops_.size(); }
  // The rule of that name (held by one or more ops), for tests and `shardwise rules`; Error listing
  // the rule names.
  const spmd::Rule& rule(std::string_view rule_name) const;

 private:
  std::vector<OpDef> ops_;
};

// A family's rules (the struct its <family>_rules() returns), built once on first use:
// ops/<family>/ops.cc takes each OpDef's rule from rules_of<<family>_rules>().
template <auto MakeRules>
const auto& rules_of() {
  static const auto rules = MakeRules();
  return rules;
}

// The built-in ops, registered once on first use by register_builtin_ops (ops/builtin.cc).
const OpRegistry& op_registry();
void register_builtin_ops(OpRegistry& registry);

// Runs an op's kernel (the context-aware one when the op has it). Without a context: single device.
std::vector<Tensor> run_forward(const OpDef& op, std::span<const Tensor> inputs, const Attrs& attrs,
                                const KernelContext* context = nullptr);
// `wanted` (one flag per input, or empty: all): the op's partial kernel computes only those where it
// has one; otherwise every gradient is computed and the unwanted ones dropped.
std::vector<Tensor> run_backward(const OpDef& op, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                                 std::span<const Tensor> out_grads, const Attrs& attrs,
                                 const KernelContext* context = nullptr, std::span<const bool> wanted = {});

// Runs an op's shape inference after checking the input count; Error names the op.
std::vector<TensorMeta> infer_checked(const OpDef& op, std::span<const TensorMeta> inputs, const Attrs& attrs);

}  // namespace shardwise::ops
