// The rotary family's registry entries: rotary_embedding (kernels.h, rule in rules.cc) and its
// verification cases. Attribute: theta (float, default 10000: Llama's rope_theta).
#include "shardwise/ops/families.h"
#include "shardwise/ops/rotary/kernels.h"
#include "shardwise/ops/rotary/rules.h"

namespace shardwise::ops {

namespace {

double theta_of(const Attrs& attrs) { return attrs.get_float("theta", kRopeTheta); }

// x [.., S, D] of `dtype` and positions [S] (or [x's dim 0, S] with `per_batch`) i64 in [0, 40]
// (repeats and gaps: any integers do).
VerifyCase rope_case(Shape x, DType dtype, double theta = kRopeTheta, bool per_batch = false) {
  const int64_t S = x[x.ndim() - 2];
  Attrs a;
  a.set("theta", theta);
  const Shape positions = per_batch ? Shape{x[0], S} : Shape{S};
  return VerifyCase{{x, positions}, {dtype, DType::I64}, a, {ValueGen{}, ValueGen{ValueGen::Kind::Index, 0, 40}}};
}

OpDef make_rotary_embedding() {
  OpDef op;
  op.name = "rotary_embedding";
  op.family = "rotary";
  op.rule = rules_of<rotary_rules>().rotary_embedding;
  op.summary =
      "rotary_embedding(x [.., S, D], positions [S] or [x dim 0, S] int; theta=10000): each row rotated by its "
      "position's angles "
      "positions[s] / theta^(2i/D), transformers' rotate_half convention (out = x cos + rotate_half(x) sin). "
      "Gradient: dout rotated back; positions take none";
  op.num_inputs = 2;
  op.infer = [](std::span<const TensorMeta> in, const Attrs& attrs) {
    check_rotary_inputs(in[0].shape, in[0].dtype, in[1].shape, in[1].dtype, theta_of(attrs));
    return std::vector<TensorMeta>{in[0]};
  };
  op.forward = [](std::span<const Tensor> in, const Attrs& attrs) {
    return std::vector<Tensor>{rotary_embedding(in[0], in[1], theta_of(attrs))};
  };
  op.backward = [](std::span<const Tensor> in, std::span<const Tensor>, std::span<const Tensor> dout,
                   const Attrs& attrs) {
    return std::vector<Tensor>{rotary_embedding_backward(dout[0], in[1], theta_of(attrs)), Tensor()};
  };
  op.backward_reads = std::vector<int>{1};  // positions; not x, not the output
  // Dims that divide every test mesh ([12, 6]), uneven ones (5, 7), a sequence of 1 (empty
  // shards), [B, heads, S, D] as the attention uses it, f32 and another theta; per-sequence
  // positions [B, S] (packed documents) on [B, heads, S, D] with dims dividing every mesh and uneven ones.
  op.cases = {rope_case({12, 6}, DType::F64),
              rope_case({2, 5, 4}, DType::F64),
              rope_case({3, 1, 2}, DType::F64),
              rope_case({2, 3, 7, 4}, DType::F64, 500000.0),
              rope_case({12, 4}, DType::F32, 100.0),
              rope_case({6, 2, 6, 4}, DType::F64, kRopeTheta, true),
              rope_case({5, 3, 7, 2}, DType::F64, 500000.0, true),
              rope_case({4, 6, 2}, DType::F32, 100.0, true)};
  return op;
}

}  // namespace

void register_rotary_ops(OpRegistry& registry) { registry.add(make_rotary_embedding()); }

}  // namespace shardwise::ops
