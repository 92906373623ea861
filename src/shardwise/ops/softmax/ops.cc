// softmax, log_softmax and cross_entropy (kernels in kernels.h, rules in
// rules.cc).
//   softmax(x; axis=-1), log_softmax(x; axis=-1): one output of x's shape.
//   cross_entropy(logits [..., C], labels [...] i64/i32; ignore_index=-100, reduction="mean")
//     -> loss ([...] for "none", a scalar for "sum" / "mean"); labels take no gradient.
//   vocab_parallel_cross_entropy: the same op with a collective kernel, so that logits may stay
//     sharded on the class dim. A separate op rather than a collective cross_entropy: whether to
//     keep the vocab sharded (two all-reduces of one or two values per row) or to gather the logits is a plan
//     decision made by choosing the op, as Megatron-LM does, and cross_entropy stays a pure local
//     kernel that never needs ranks run together.
#include <cstddef>
#include <string>
#include <vector>

#include "shardwise/ops/families.h"
#include "shardwise/ops/softmax/rules.h"
#include "shardwise/ops/softmax/kernels.h"
#include "shardwise/ops/softmax/lm_head.h"

namespace shardwise::ops {

namespace {

using Kind = ValueGen::Kind;

VerifyCase softmax_case(Shape shape, int64_t axis, DType dtype) {
  Attrs a;
  a.set("axis", axis);
  return VerifyCase{{shape}, {dtype}, std::move(a), {ValueGen{}}};
}

// 12x6 divides [2], [3], [2,3] and 4x12 divides [2], [2,2] (even); 5x7 does not (uneven); 1x6
// and 2x3x4 have a dim smaller than a mesh dim (empty shards). Both axes of a 2-D tensor, the
// middle axis of a 3-D one, and an f32 case.
std::vector<VerifyCase> softmax_cases() {
  const DType f64 = DType::F64;
  return {
      softmax_case({12, 6}, -1, f64), softmax_case({12, 6}, 0, f64),  softmax_case({4, 12}, 1, f64),
      softmax_case({5, 7}, -1, f64),  softmax_case({5, 7}, 0, f64),   softmax_case({1, 6}, -1, f64),
      softmax_case({2, 3, 4}, 1, f64), softmax_case({5, 7}, -1, DType::F32),
  };
}

OpDef make_softmax(bool log) {
  OpDef def;
  def.name = log ? "log_softmax" : "softmax";
  def.family = "softmax";
  def.rule = rules_of<softmax_rules>().softmax;
  def.summary = log ? "log_softmax(x; axis=-1) = x - max - log(sum(exp(x - max))) along axis; gradient dx = dout - "
                      "exp(out) * sum(dout)"
                    : "softmax(x; axis=-1) = exp(x - max) / sum(exp(x - max)) along axis; gradient dx = out * (dout - "
                      "sum(dout * out))";
  def.num_inputs = 1;
  def.num_outputs = 1;
  std::string_view name = log ? "log_softmax" : "softmax";
  def.infer = [name](std::span<const TensorMeta> in, const Attrs& attrs) {
    softmax_axis(attrs, in[0].shape.ndim(), name);
    SW_CHECK(is_floating(in[0].dtype), "{}: x must have a floating dtype (f32, f64, f16, bf16), got {}", name,
             dtype_name(in[0].dtype));
    return std::vector<TensorMeta>{in[0]};
  };
  def.forward = [log, name](std::span<const Tensor> in, const Attrs& attrs) {
    int axis = softmax_axis(attrs, in[0].ndim(), name);
    return std::vector<Tensor>{log ? log_softmax(in[0], axis) : softmax(in[0], axis)};
  };
  def.backward = [log, name](std::span<const Tensor>, std::span<const Tensor> out, std::span<const Tensor> dout,
                             const Attrs& attrs) {
    int axis = softmax_axis(attrs, out[0].ndim(), name);
    return std::vector<Tensor>{log ? log_softmax_backward(out[0], dout[0], axis)
                                   : softmax_backward(out[0], dout[0], axis)};
  };
  def.backward_reads = std::vector<int>{1};  // the output only
  def.cases = softmax_cases();
  return def;
}

VerifyCase ce_case(Shape logits, const char* reduction, DType dtype = DType::F64, int64_t ignore_index = -100) {
  Shape labels;
  for (int d = 0; d + 1 < logits.ndim(); ++d) labels.push_back(logits[d]);
  Attrs a;
  a.set("reduction", std::string(reduction));
  if (ignore_index != -100) a.set("ignore_index", ignore_index);
  double classes = static_cast<double>(logits.back());
  return VerifyCase{{logits, labels}, {dtype, DType::I64}, std::move(a),
                    {ValueGen{}, ValueGen{Kind::Index, 0, classes - 1}}};
}

// Every reduction on: 12x6 logits (even on [2], [3], [2,3]), 4x12 (even on [2], [2,2]), 5x7
// (uneven), 1x6 (a batch of 1: empty shards), 2x3x4 (two batch dims); ignore_index = 0 is a real
// class, so some labels are ignored; 2x2 logits (C = 2) with ignore_index 0 ignore about half the
// labels, often a whole shard; and f32.
std::vector<VerifyCase> ce_cases() {
  std::vector<VerifyCase> cases;
  for (const char* r : {"mean", "sum", "none"}) {
    cases.push_back(ce_case({12, 6}, r));
    cases.push_back(ce_case({4, 12}, r, DType::F64, 0));
    cases.push_back(ce_case({5, 7}, r, DType::F64, 0));
    cases.push_back(ce_case({1, 6}, r));
    cases.push_back(ce_case({2, 3, 4}, r, DType::F64, 2));
    cases.push_back(ce_case({2, 2}, r, DType::F64, 0));
  }
  cases.push_back(ce_case({5, 7}, "mean", DType::F32));
  cases.push_back(ce_case({5, 7}, "none", DType::F32, 0));
  return cases;
}

OpDef make_cross_entropy() {
  OpDef def;
  def.name = "cross_entropy";
  def.family = "softmax";
  def.rule = rules_of<softmax_rules>().cross_entropy;
  def.summary =
      "cross_entropy(logits [..., C], labels [...] i64/i32; ignore_index=-100, reduction=mean|sum|none): loss_i = "
      "logsumexp(logits_i) - logits_i[label_i], 0 where label_i == ignore_index; mean divides by the count of "
      "non-ignored labels (NaN when none). Gradient: dlogits = (softmax - onehot) * dloss (/ count), 0 on ignored "
      "rows; no gradient for labels";
  def.num_inputs = 2;
  def.num_outputs = 1;
  def.infer = [](std::span<const TensorMeta> in, const Attrs& attrs) {
    check_cross_entropy_args(in[0].shape, in[0].dtype, in[1].shape, in[1].dtype);
    cross_entropy_ignore_index(attrs);
    LossReduction r = loss_reduction(attrs, "cross_entropy");
    return std::vector<TensorMeta>{{cross_entropy_loss_shape(in[1].shape, r), in[0].dtype}};
  };
  def.forward = [](std::span<const Tensor> in, const Attrs& attrs) {
    return std::vector<Tensor>{cross_entropy(in[0], in[1], cross_entropy_ignore_index(attrs),
                                             loss_reduction(attrs, "cross_entropy"))};
  };
  def.backward = [](std::span<const Tensor> in, std::span<const Tensor>, std::span<const Tensor> dout,
                    const Attrs& attrs) {
    return std::vector<Tensor>{cross_entropy_backward(in[0], in[1], dout[0], cross_entropy_ignore_index(attrs),
                                                      loss_reduction(attrs, "cross_entropy")),
                               Tensor()};
  };
  def.cases = ce_cases();
  return def;
}

// ---- vocab_parallel_cross_entropy

constexpr std::string_view kVocabParallel = "vocab_parallel_cross_entropy";

// The class block of the local logits (tensor 0 of the context) and the group of ranks holding
// the other blocks of the same rows (null on one device).
struct ClassBlock {
  ClassShard shard;
  comm::Communicator* group = nullptr;
};
ClassBlock class_block(const Tensor& logits, const KernelContext& ctx) {
  SW_CHECK(logits.defined() && logits.ndim() >= 1, "{}: logits must have a class dim", kVocabParallel);
  const int cls = logits.ndim() - 1;
  ClassBlock b;
  if (!ctx.tensors.empty() && ctx.tensors[0].global_shape.ndim() == logits.ndim()) {
    b.shard = {ctx.tensors[0].global_shape[cls], ctx.tensors[0].offset[static_cast<size_t>(cls)]};
  }
  b.group = ctx.group_sharding(0, 1u << cls, kVocabParallel);
  return b;
}

void all_reduce_rows(comm::Communicator* group, std::vector<double>& rows, comm::Reduce op) {
  if (group) group->all_reduce(rows.data(), rows.data(), static_cast<int64_t>(rows.size()), DType::F64, op);
}

// The global row max (all-reduce max) and this block's sums given it.
CrossEntropyRowSums global_row_sums(const Tensor& logits, const Tensor& labels, int64_t ignore_index,
                                    const ClassBlock& b, std::vector<double>& row_max) {
  row_max = cross_entropy_local_max(logits);
  all_reduce_rows(b.group, row_max, comm::Reduce::Max);
  return cross_entropy_local_sums(logits, labels, row_max, ignore_index, b.shard);
}

std::vector<Tensor> vp_ce_forward(std::span<const Tensor> in, const Attrs& attrs, const KernelContext& ctx) {
  const int64_t ignore_index = cross_entropy_ignore_index(attrs);
  const LossReduction reduction = loss_reduction(attrs, kVocabParallel);
  ClassBlock b = class_block(in[0], ctx);
  std::vector<double> row_max;
  CrossEntropyRowSums s = global_row_sums(in[0], in[1], ignore_index, b, row_max);
  // sum_exp and the target logit (0 on the ranks without the label) in one all-reduce.
  const size_t rows = s.sum_exp.size();
  std::vector<double> buf(s.sum_exp);
  buf.insert(buf.end(), s.target.begin(), s.target.end());
  all_reduce_rows(b.group, buf, comm::Reduce::Sum);
  s.sum_exp.assign(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(rows));
  s.target.assign(buf.begin() + static_cast<std::ptrdiff_t>(rows), buf.end());
  return {cross_entropy_from_rows(in[1], in[0].dtype(), row_max, s, ignore_index, reduction)};
}

// Recomputes the global row max and sum of exponentials (two all-reduces of one value per row)
// rather than saving them as extra forward outputs: the op keeps cross_entropy's signature.
std::vector<Tensor> vp_ce_backward(std::span<const Tensor> in, std::span<const Tensor>, std::span<const Tensor> dout,
                                   const Attrs& attrs, const KernelContext& ctx) {
  const int64_t ignore_index = cross_entropy_ignore_index(attrs);
  const LossReduction reduction = loss_reduction(attrs, kVocabParallel);
  ClassBlock b = class_block(in[0], ctx);
  std::vector<double> row_max;
  CrossEntropyRowSums s = global_row_sums(in[0], in[1], ignore_index, b, row_max);
  all_reduce_rows(b.group, s.sum_exp, comm::Reduce::Sum);
  return {cross_entropy_backward_from_rows(in[0], in[1], dout[0], row_max, s.sum_exp, ignore_index, reduction,
                                           b.shard),
          Tensor()};
}

// Each reduction on 12x12 (even on every mesh) and 3x5 (uneven; C = 5 over [2,2] and [2,3]
// leaves empty class shards) with ignore_index 0 (a real class, so some rows are ignored); 1x6
// (empty batch shards) and 2x2x3 (two batch dims) once each; one f32 case.
std::vector<VerifyCase> vp_ce_cases() {
  std::vector<VerifyCase> cases;
  for (const char* r : {"mean", "sum", "none"}) {
    cases.push_back(ce_case({12, 12}, r));
    cases.push_back(ce_case({3, 5}, r, DType::F64, 0));
  }
  cases.push_back(ce_case({1, 6}, "sum"));
  cases.push_back(ce_case({2, 2, 3}, "none", DType::F64, 2));
  cases.push_back(ce_case({3, 5}, "mean", DType::F32));
  return cases;
}

OpDef make_vocab_parallel_cross_entropy() {
  OpDef def = make_cross_entropy();
  def.name = std::string(kVocabParallel);
  def.rule = rules_of<softmax_rules>().vocab_parallel_cross_entropy;
  def.summary =
      "vocab_parallel_cross_entropy: cross_entropy's inputs, attributes, loss and gradient, with logits that may "
      "stay sharded on the class dim (Megatron-LM): the kernel all-reduces (max) the row max, then (sum) each row's "
      "sum of exp(logit - max) and its target logit (picked by the rank whose class block holds the label, 0 "
      "elsewhere). Gradient: dlogits = (softmax - onehot) * w on each rank's class block, the global row max and "
      "sum recomputed (two all-reduces of one value per row)";
  def.forward = nullptr;
  def.backward = nullptr;
  def.forward_in_context = vp_ce_forward;
  def.backward_in_context = vp_ce_backward;
  def.collective = true;
  def.cases = vp_ce_cases();
  return def;
}

// ---- lm_head_cross_entropy and vocab_parallel_lm_head_cross_entropy (lm_head.h)

constexpr std::string_view kLmHead = "lm_head_cross_entropy";
constexpr std::string_view kVpLmHead = "vocab_parallel_lm_head_cross_entropy";

VerifyCase head_case(Shape h, int64_t vocab, const char* reduction, DType dtype = DType::F64,
                     int64_t ignore_index = -100, int64_t chunk_bytes = 0, int64_t forward_grads = 0,
                     double grad_scale = 1.0) {
  Shape labels;
  for (int d = 0; d + 1 < h.ndim(); ++d) labels.push_back(h[d]);
  Shape w{vocab, h.back()};
  Attrs a;
  a.set("reduction", std::string(reduction));
  if (ignore_index != -100) a.set("ignore_index", ignore_index);
  if (chunk_bytes > 0) a.set("chunk_bytes", chunk_bytes);
  if (forward_grads != 0) a.set("forward_grads", forward_grads), a.set("grad_scale", grad_scale);
  return VerifyCase{{h, w, labels}, {dtype, dtype, DType::I64}, std::move(a),
                    {ValueGen{}, ValueGen{}, ValueGen{Kind::Index, 0, static_cast<double>(vocab - 1)}}};
}

// Every reduction on 12x12 rows over 12 classes (even on every mesh) in one chunk, and on 5x3 rows
// over 7 classes (uneven rows and vocab blocks; a vocab block may be empty on [2,3]) with ignore_index 0 (a
// real class) in chunks of one row; 1x4 rows (empty row shards); 2x3x4 rows (two batch dims) in
// chunks of two rows; f32. Gradients formed in the forward (forward_grads; few cases: each extra
// output multiplies the reverse and grad combinations): both on 12x12 "sum" and on 5x3 "mean" in
// one-row chunks (grad_scale 0.25, which the verifier's random dloss is not: the backward
// rescales), dh only on 4x3 "sum" in two-row chunks, dW only on 1x4 (empty row shards). bf16 h and W
// (--compute bf16: f32 loss, bf16 gradients) on 5x3 "mean" in two-row chunks. Not with the
// gradients formed in the forward: their bf16 parts over row or vocab blocks, each rounded to bf16
// and then rescaled to the verifier's random dloss (rounded again), sum to values outside its bf16
// tolerance (3e-2) on some meshes; tests/ops/softmax/test_lm_head.cc checks that path's bits.
std::vector<VerifyCase> head_cases() {
  std::vector<VerifyCase> cases;
  for (const char* r : {"mean", "sum", "none"}) {
    cases.push_back(head_case({12, 12}, 12, r));
    cases.push_back(head_case({5, 3}, 7, r, DType::F64, 0, 8));
  }
  cases.push_back(head_case({1, 4}, 2, "sum"));
  cases.push_back(head_case({2, 3, 4}, 5, "none", DType::F64, 2, 80));
  cases.push_back(head_case({5, 3}, 7, "mean", DType::F32, -100, 64));
  cases.push_back(head_case({12, 12}, 12, "sum", DType::F64, -100, 0, 3));
  cases.push_back(head_case({5, 3}, 7, "mean", DType::F64, 0, 8, 3, 0.25));
  cases.push_back(head_case({4, 3}, 5, "sum", DType::F64, 2, 80, 1));
  cases.push_back(head_case({1, 4}, 2, "sum", DType::F64, -100, 0, 2));
  cases.push_back(head_case({5, 3}, 7, "mean", DType::BF16, 0, 2 * 7 * 4));
  return cases;
}

// W's vocab block (input 1, dim 0) and the group holding the other blocks (vocab-parallel only).
LmHeadArgs head_args(const Attrs& attrs, const KernelContext* ctx, std::string_view name) {
  LmHeadArgs a = lm_head_args(attrs, name);
  if (ctx == nullptr || ctx->tensors.size() < 2 || ctx->tensors[1].global_shape.ndim() != 2) return a;
  a.shard = {ctx->tensors[1].global_shape[0], ctx->tensors[1].offset[0]};
  a.group = ctx->group_sharding(1, 1u, name);
  return a;
}

// The forward's dh and dW among the op's outputs (undefined where forward_grads did not ask).
std::array<Tensor, 2> saved_grads(const LmHeadArgs& a, std::span<const Tensor> out) {
  std::array<Tensor, 2> saved;
  size_t next = 1;
  if ((a.forward_grads & kLmHeadGradH) && next < out.size()) saved[0] = out[next++];
  if ((a.forward_grads & kLmHeadGradW) && next < out.size()) saved[1] = out[next++];
  return saved;
}

OpDef make_lm_head(bool vocab_parallel) {
  OpDef def;
  const std::string_view name = vocab_parallel ? kVpLmHead : kLmHead;
  def.name = std::string(name);
  def.family = "softmax";
  const SoftmaxRules& rules = rules_of<softmax_rules>();
  def.rule = vocab_parallel ? rules.vocab_parallel_lm_head_cross_entropy : rules.lm_head_cross_entropy;
  def.summary = vocab_parallel
                    ? "vocab_parallel_lm_head_cross_entropy: lm_head_cross_entropy with W [V, H] sharded on the "
                      "vocab: each chunk's row max (max), sum of exponentials and target logit (sum) are "
                      "all-reduced over the ranks holding the other vocab blocks; dh is this block's part"
                    : "lm_head_cross_entropy(h [..., H], W [V, H], labels [...]; ignore_index=-100, "
                      "reduction=mean|sum|none, chunk_bytes=64 MiB, forward_grads=0, grad_scale=1) = "
                      "cross_entropy(h · Wᵀ, labels), the logits computed and dropped in row chunks of about "
                      "chunk_bytes (never [N, V] whole); backward recomputes each chunk's logits: dh = dlogits · W, "
                      "dW = Σ dlogitsᵀ · h; no gradient for labels. forward_grads (bit 1 dh, bit 2 dW; sum / mean "
                      "only): those gradients for dloss = grad_scale are formed in the forward from each chunk "
                      "and are extra outputs, which the backward returns (rescaled when dloss differs)";
  def.num_inputs = 3;
  def.num_outputs = -1;  // the loss, then dh and dW as forward_grads asks
  def.infer = [name](std::span<const TensorMeta> in, const Attrs& attrs) {
    check_lm_head_args(in[0].shape, in[0].dtype, in[1].shape, in[1].dtype, in[2].shape, in[2].dtype);
    LmHeadArgs a = lm_head_args(attrs, name);
    std::vector<TensorMeta> out{{cross_entropy_loss_shape(in[2].shape, a.reduction), lm_head_loss_dtype(in[0].dtype)}};
    if (a.forward_grads & kLmHeadGradH) out.push_back(in[0]);
    if (a.forward_grads & kLmHeadGradW) out.push_back(in[1]);
    return out;
  };
  auto forward = [name](std::span<const Tensor> in, const Attrs& attrs, const KernelContext* ctx) {
    return lm_head_cross_entropy_outputs(in[0], in[1], in[2], head_args(attrs, ctx, name));
  };
  auto backward = [name](std::span<const Tensor> in, std::span<const Tensor> out, std::span<const Tensor> dout,
                         const Attrs& attrs, const KernelContext* ctx, std::array<bool, 2> wanted) {
    LmHeadArgs a = head_args(attrs, ctx, name);
    auto [dh, dw] = lm_head_cross_entropy_backward(in[0], in[1], in[2], dout[0], a, wanted, saved_grads(a, out));
    return std::vector<Tensor>{dh, dw, Tensor()};
  };
  if (vocab_parallel) {
    def.forward_in_context = [forward](std::span<const Tensor> in, const Attrs& a, const KernelContext& ctx) {
      return forward(in, a, &ctx);
    };
    def.backward_in_context = [backward](std::span<const Tensor> in, std::span<const Tensor> out,
                                         std::span<const Tensor> dout, const Attrs& a, const KernelContext& ctx) {
      return backward(in, out, dout, a, &ctx, {true, true});
    };
    def.collective = true;
  } else {
    def.forward = [forward](std::span<const Tensor> in, const Attrs& a) { return forward(in, a, nullptr); };
    def.backward = [backward](std::span<const Tensor> in, std::span<const Tensor> out, std::span<const Tensor> dout,
                              const Attrs& a) { return backward(in, out, dout, a, nullptr, {true, true}); };
    // Only the wanted GEMMs (a frozen head weight; zero-bubble's input and weight halves). The
    // vocab-parallel op has no such kernel: a partial kernel gets no communicator.
    def.backward_partial = [backward](std::span<const Tensor> in, std::span<const Tensor> out,
                                      std::span<const Tensor> dout, const Attrs& a, std::span<const bool> wanted) {
      return backward(in, out, dout, a, nullptr, {wanted[0], wanted[1]});
    };
  }
  // h, W, labels (for the gradients not formed in the forward) and the forward's dh and dW; not the
  // loss. With both formed in the forward only those two (h's dtype and the labels' shape come from
  // stand-ins): stage 3 gathers no head weight for the backward and h is freed after the forward.
  def.backward_reads = std::vector<int>{0, 1, 2, 4, 5};
  def.backward_reads_for = [name](const Attrs& attrs) {
    const int both = kLmHeadGradH | kLmHeadGradW;
    return (lm_head_args(attrs, name).forward_grads & both) == both ? std::vector<int>{4, 5}
                                                                     : std::vector<int>{0, 1, 2, 4, 5};
  };
  def.grad_outputs = 1;  // dh and dW carry no gradient: their slots hold themselves, not a zero fill
  def.cases = head_cases();
  return def;
}

}  // namespace

void register_softmax_ops(OpRegistry& registry) {
  registry.add(make_softmax(false));
  registry.add(make_softmax(true));
  registry.add(make_cross_entropy());
  registry.add(make_vocab_parallel_cross_entropy());
  registry.add(make_lm_head(false));
  registry.add(make_lm_head(true));
}

}  // namespace shardwise::ops
