#pragma once
// Rules derived from a factor description: the forward, reverse and grad parts of a rule written
// once (as Shardy's sharding rules and GSPMD's einsum view of ops do).
//
// A description labels every dim of every input and output with a factor letter (the einsum
// helper's letters: the same letter on two tensors is the same logical axis; '1' marks a broadcast
// size-1 dim that is never sharded). From the labels alone follow:
//  - kept factors (on an output): sharded on the output as they are on the inputs;
//  - contracted factors (on inputs, on no output): a mesh dim that shards one makes every output
//    Partial(contraction) there (each rank reduces its slice);
//  - broadcast factors (on an output, missing on an input): the input's gradient is Partial(sum)
//    on the mesh dims sharding them;
//  - replicated factors (listed): never sharded (a softmax's axis, a cumsum's axis);
//  - even factors (listed): sharded only by the mesh dims (kept greedily in split order) under
//    which every chunk stays equal and non-empty (a mean's P(avg) needs equal local counts);
//  - grad-replicated factors (listed): replicated in the grad part only (the gradient kernel
//    needs them whole: a mean's count, a tie count).
// Derivation:
//  forward  merge the inputs' shardings (spmd::merge_axes: argument order, first sharding wins, a
//           mesh dim shards one letter); required inputs and outputs = the merged letters.
//  reverse  merge the wanted outputs' shardings; a wanted Partial(contraction) becomes a shard of
//           the contracted factor the first input sharding that mesh dim shards, else of the first
//           contracted factor; the inputs follow the letters.
//  grad     grad inputs are inputs ++ outputs ++ output gradients; the tensors the gradient kernel
//           reads (`grad_reads`, output gradients always) merge in that order (or inputs, output
//           gradients, outputs: `grad_gradients_first`), the others keep their layout (no
//           reshard); each input's gradient takes its input's letters plus Partial(sum) on the
//           mesh dims sharding the output-gradient letters it lacks.
// What a description cannot say is which Partial placements an op lets through: on a mesh dim
// that shards no factor, each part asks the rule's partial policy (a small table per op kind:
// linear, multilinear, max-preserving, ...). A mesh dim that shards a factor never carries a
// Partial: sharding wins and the Partial input is resharded.
#include <array>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "shardwise/core/error.h"
#include "shardwise/spmd/einsum.h"
#include "shardwise/spmd/rule.h"

namespace shardwise::spmd {

constexpr int kMaxFactorInputs = 4;   // inputs of one op (flash_attention_docs: q, k, v, ids)
constexpr int kMaxFactorOutputs = 2;  // outputs of one op (topk: values, indices)
// Tensors a grad part sees: inputs ++ outputs ++ output gradients.
constexpr int kMaxGradTensors = kMaxFactorInputs + 2 * kMaxFactorOutputs;

// One tensor's letters, inline (rules do not allocate), with the set of its factor letters.
struct Labels {
  std::array<char, kMaxDims> chars{};
  int n = 0;
  uint32_t letters = 0;  // bit c - 'a' for each letter a..z
  void push(char c) {
    chars[static_cast<size_t>(n++)] = c;
    if (c >= 'a' && c <= 'z') letters |= 1u << (c - 'a');
  }
  std::string_view view() const { return {chars.data(), static_cast<size_t>(n)}; }
  bool has(char c) const { return c >= 'a' && c <= 'z' ? (letters >> (c - 'a')) & 1u : view().find(c) != std::string_view::npos; }
};

// Labels "ab.." for a tensor of rank n.
Labels labels_of_rank(int n);

// The description of one call: every input's and output's labels and the outputs' shapes.
struct Factors {
  std::array<Labels, kMaxFactorInputs> inputs;
  std::array<Labels, kMaxFactorOutputs> outputs;
  std::array<Shape, kMaxFactorOutputs> output_shapes;
  int num_inputs = 0, num_outputs = 0;
  Labels replicated;                     // factors never sharded
  Labels even;                           // factors sharded only into equal non-empty chunks
  Labels grad_replicated;                // factors the grad part never shards
  ReduceOp contraction = ReduceOp::Sum;  // what a sharded contracted factor makes the outputs
  void add_input(Labels l) {
    SW_CHECK(num_inputs < kMaxFactorInputs, "a factor description takes at most {} inputs", kMaxFactorInputs);
    inputs[static_cast<size_t>(num_inputs++)] = l;
  }
  void add_output(Labels l, Shape shape) {
    SW_CHECK(num_outputs < kMaxFactorOutputs, "a factor description takes at most {} outputs", kMaxFactorOutputs);
    output_shapes[static_cast<size_t>(num_outputs)] = shape;
    outputs[static_cast<size_t>(num_outputs++)] = l;
  }
};

// A decision on one mesh dim that shards no factor. `given` / `operands`: one placement per
// tensor the part looks at (forward: inputs; reverse: the first output's wanted placement only;
// grad: inputs ++ outputs ++ output gradients, Replicate for tensors the kernel does not read).
// The policy also sees the tensors (forward, reverse: the inputs; grad: every grad input) and the
// attributes: a Partial table may depend on dtypes and attributes (scale's sign, cast's target).
// The policy sets the Partial each operand keeps (Replicate, the default: resharded) and the
// placement of each result (forward, reverse: outputs; grad: the inputs' gradients).
struct PartialChoice {
  std::array<Placement, kMaxGradTensors> operands{};
  std::array<Placement, kMaxFactorInputs> results{};  // kMaxFactorInputs >= kMaxFactorOutputs
};
using PartialPolicy =
    std::function<void(std::span<const Placement> given, std::span<const TensorSpec> inputs, const Attrs&,
                       PartialChoice& choice)>;

struct FactorRule {
  std::string name;
  std::string summary;
  int num_inputs = 1;
  // Labels the call's tensors; Error (naming the rule) when the shapes do not fit the op.
  std::function<Factors(std::span<const TensorSpec> inputs, const Attrs&)> describe;
  PartialPolicy forward_partials;  // given: input placements
  PartialPolicy reverse_partials;  // given: the wanted placement of output 0 (operands: inputs)
  PartialPolicy grad_partials;     // given: every grad input's placement (unread ones Replicate)
  // Bits over inputs ++ outputs: what the gradient kernel reads (output gradients are always read).
  uint32_t grad_reads = ~0u;
  // Bits over inputs: those that take no gradient (a where's condition): reported Replicate.
  uint32_t no_grad = 0;
  // Bits over inputs ++ outputs: read for their layout only (merged, but left as given).
  uint32_t grad_layout_only = 0;
  // Bits over outputs: those that take no gradient (integer outputs): their gradients are not
  // merged and are laid out on the merged letters (Replicate elsewhere).
  uint32_t no_grad_outputs = 0;
  // Merge order inputs, output gradients, outputs (a gradient kernel whose outputs are auxiliary).
  bool grad_gradients_first = false;
};

// The rule's three parts, derived from the description.
Rule derive_rule(FactorRule rule);

// The multilinear policy (matmul, multiply): on a mesh dim, the first operand holding P(sum|avg)
// keeps it and the others are resharded. Forward: every output takes it. Reverse: a wanted
// P(sum|avg) is asked of input 0 alone. Grad: input i's gradient takes it unless input i holds it.
void multilinear_forward(std::span<const Placement> given, std::span<const TensorSpec>, const Attrs&,
                         PartialChoice& choice);
void multilinear_reverse(std::span<const Placement> given, std::span<const TensorSpec>, const Attrs&,
                         PartialChoice& choice);
void multilinear_grad(std::span<const Placement> given, std::span<const TensorSpec>, const Attrs&,
                      PartialChoice& choice);


}  // namespace shardwise::spmd
