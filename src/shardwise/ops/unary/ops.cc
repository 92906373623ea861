// The unary elementwise ops: registry entries (shape inference, kernels from kernels.h,
// gradients, SPMD rules from rules.cc) and their verification cases.
#include <string>
#include <utility>

#include "shardwise/ops/families.h"
#include "shardwise/ops/unary/rules.h"
#include "shardwise/ops/unary/kernels.h"

namespace shardwise::ops {

namespace {

using Kind = ValueGen::Kind;

VerifyCase make_case(Shape shape, DType dtype, ValueGen gen = {}, Attrs attrs = {}) {
  return VerifyCase{{shape}, {dtype}, std::move(attrs), {gen}};
}

// The float cases every unary op gets: even (12x6), uneven (5x7), dims smaller than the mesh
// (1x5: empty shards on every mesh; 2x5: on [3] and [2,3]), f32 and f16 cases, and optionally a
// 3-D case. No bf16 case: the verifier stores each random part of a bf16 Partial(sum) in bf16, so
// on [2,3] the parts alone stray beyond its tolerance (the kernels' bf16 paths are unit-tested).
std::vector<VerifyCase> float_cases(ValueGen gen, bool three_d, const Attrs& attrs = {}) {
  std::vector<VerifyCase> cases = {
      make_case({12, 6}, DType::F64, gen, attrs),
      make_case({5, 7}, DType::F64, gen, attrs),
      make_case({1, 5}, DType::F64, gen, attrs),
      make_case({12}, DType::F32, gen, attrs),
      make_case({2, 5}, DType::F32, gen, attrs),
      make_case({12}, DType::F16, gen, attrs),
  };
  if (three_d) cases.push_back(make_case({2, 3, 4}, DType::F64, gen, attrs));
  return cases;
}

// Integer cases, with small values so ties are frequent: even, uneven, tiny, and unsigned.
void add_int_cases(std::vector<VerifyCase>& cases, const Attrs& attrs = {}) {
  ValueGen small{Kind::SmallInts, -5, 5};
  cases.push_back(make_case({12}, DType::I64, small, attrs));
  cases.push_back(make_case({5, 7}, DType::I32, small, attrs));
  cases.push_back(make_case({2, 5}, DType::I8, small, attrs));
  cases.push_back(make_case({6, 2}, DType::U8, ValueGen{Kind::SmallInts, 0, 9}, attrs));
}

struct UnarySpec {
  UnaryOp op;
  spmd::Rule UnaryRules::*rule;
  const char* summary;
  ValueGen gen;
  bool three_d;
};

OpDef make_unary(const UnarySpec& spec) {
  UnaryOp op = spec.op;
  OpDef def;
  def.name = std::string(unary_op_name(op));
  def.family = "unary";
  def.rule = rules_of<unary_rules>().*spec.rule;
  def.summary = spec.summary;
  def.infer = [op](std::span<const TensorMeta> in, const Attrs&) {
    check_unary_dtype(op, in[0].dtype);
    return std::vector<TensorMeta>{in[0]};
  };
  def.forward = [op](std::span<const Tensor> in, const Attrs&) { return std::vector<Tensor>{unary(op, in[0])}; };
  def.backward = [op](std::span<const Tensor> in, std::span<const Tensor> out, std::span<const Tensor> dout,
                      const Attrs&) { return std::vector<Tensor>{unary_backward(op, in[0], out[0], dout[0])}; };
  if (op == UnaryOp::Gelu) def.backward_reads = std::vector<int>{0};  // recomputed from x; not the output
  def.cases = float_cases(spec.gen, spec.three_d);
  if (unary_supports(op, DType::I32)) add_int_cases(def.cases);
  return def;
}

Attrs scale_attrs(double s, double b, bool after) {
  return Attrs{{"scale", s}, {"bias", b}, {"bias_after_scale", after}};
}

OpDef make_scale() {
  OpDef def;
  def.name = "scale";
  def.family = "unary";
  def.rule = rules_of<unary_rules>().scale;
  def.summary = "out = scale * x + bias (bias_after_scale, default) or scale * (x + bias); attrs scale=1, "
                "bias=0, bias_after_scale=true (PaddlePaddle's scale)";
  def.infer = [](std::span<const TensorMeta> in, const Attrs& attrs) {
    check_scale_args(in[0].dtype, attrs.get_float("scale", 1.0), attrs.get_float("bias", 0.0));
    attrs.get_bool("bias_after_scale", true);  // a wrong kind is an Error here, not in the kernel
    return std::vector<TensorMeta>{in[0]};
  };
  def.forward = [](std::span<const Tensor> in, const Attrs& attrs) {
    return std::vector<Tensor>{scale(in[0], attrs.get_float("scale", 1.0), attrs.get_float("bias", 0.0),
                                     attrs.get_bool("bias_after_scale", true))};
  };
  def.backward = [](std::span<const Tensor>, std::span<const Tensor>, std::span<const Tensor> dout,
                    const Attrs& attrs) {
    return std::vector<Tensor>{scale_backward(dout[0], attrs.get_float("scale", 1.0))};
  };
  def.backward_reads = std::vector<int>{};
  ValueGen uniform{};
  // Every branch of the rule: affine (P(sum) -> R), linear, negative scale (max/min swap),
  // bias before scale, and a zero scale (a constant output).
  def.cases = float_cases(uniform, true, scale_attrs(2.0, 0.5, true));
  def.cases.push_back(make_case({5, 7}, DType::F64, uniform, scale_attrs(-1.5, 0.0, true)));
  def.cases.push_back(make_case({12, 6}, DType::F64, uniform, scale_attrs(-0.5, 1.0, false)));
  def.cases.push_back(make_case({2, 5}, DType::F32, uniform, scale_attrs(3.0, 0.0, false)));
  def.cases.push_back(make_case({12}, DType::F64, uniform, scale_attrs(0.0, 2.0, true)));
  ValueGen small{Kind::SmallInts, -5, 5};
  def.cases.push_back(make_case({12}, DType::I64, small, scale_attrs(3.0, -2.0, true)));
  def.cases.push_back(make_case({5, 7}, DType::I32, small, scale_attrs(-2.0, 0.0, true)));
  def.cases.push_back(make_case({2, 5}, DType::I8, small, scale_attrs(2.0, 1.0, false)));
  def.cases.push_back(make_case({6, 2}, DType::U8, ValueGen{Kind::SmallInts, 0, 9}, scale_attrs(0.0, 4.0, true)));
  return def;
}

DType cast_dtype(const Attrs& attrs) {
  SW_CHECK(attrs.has("dtype"), "cast: attribute dtype (a dtype name such as \"f32\") is required, got '{}'",
           attrs.to_string());
  return parse_dtype(attrs.get_string("dtype", ""));
}

OpDef make_cast() {
  OpDef def;
  def.name = "cast";
  def.family = "unary";
  def.rule = rules_of<unary_rules>().cast;
  def.summary = "converts to attr dtype (\"f32\", \"i32\", \"bool\", ...): to bool is x != 0, float to int "
                "truncates and saturates (NaN -> 0), int to int wraps; gradient cast back (floats only)";
  def.infer = [](std::span<const TensorMeta> in, const Attrs& attrs) {
    return std::vector<TensorMeta>{{in[0].shape, cast_dtype(attrs)}};
  };
  def.forward = [](std::span<const Tensor> in, const Attrs& attrs) {
    return std::vector<Tensor>{cast(in[0], cast_dtype(attrs))};
  };
  def.backward = [](std::span<const Tensor> in, std::span<const Tensor>, std::span<const Tensor> dout,
                    const Attrs&) { return std::vector<Tensor>{cast_backward(dout[0], in[0].dtype())}; };
  def.backward_reads = std::vector<int>{};  // neither: the input's dtype only, which its stand-in has
  auto to = [](const char* name) { return Attrs{{"dtype", std::string(name)}}; };
  ValueGen uniform{};
  ValueGen wide{Kind::Uniform, -300, 300};  // crosses the i8 / u8 ranges: saturation and wraparound
  ValueGen small{Kind::SmallInts, -5, 5};
  ValueGen bits{Kind::SmallInts, 0, 1};
  def.cases = float_cases(uniform, true, to("f32"));  // f64 -> f32 (and f32 -> f32 in the 1-D case)
  def.cases.push_back(make_case({5, 7}, DType::F32, uniform, to("f64")));
  def.cases.push_back(make_case({12, 6}, DType::F64, wide, to("i32")));
  def.cases.push_back(make_case({2, 5}, DType::F64, wide, to("i8")));
  def.cases.push_back(make_case({5, 7}, DType::F64, uniform, to("bool")));
  def.cases.push_back(make_case({12}, DType::F64, uniform, to("bf16")));
  def.cases.push_back(make_case({5, 7}, DType::I32, small, to("f64")));
  def.cases.push_back(make_case({12}, DType::I8, small, to("i64")));
  def.cases.push_back(make_case({2, 5}, DType::I64, ValueGen{Kind::SmallInts, -300, 300}, to("i8")));
  def.cases.push_back(make_case({12}, DType::I32, small, to("u8")));
  def.cases.push_back(make_case({6, 2}, DType::U8, ValueGen{Kind::SmallInts, 0, 255}, to("i32")));
  def.cases.push_back(make_case({5, 7}, DType::Bool, bits, to("f32")));
  def.cases.push_back(make_case({12}, DType::Bool, bits, to("i32")));
  def.cases.push_back(make_case({12}, DType::I32, small, to("bool")));
  return def;
}

}  // namespace

void register_unary_ops(OpRegistry& registry) {
  ValueGen any{};
  ValueGen positive{Kind::Uniform, 0.5, 2.0};  // inside the domain of log, sqrt, rsqrt, 1/x
  const UnarySpec specs[] = {
      {UnaryOp::Abs, &UnaryRules::elementwise_unary, "|x|; gradient sign(x) dy (0 at x = 0)", any, false},
      {UnaryOp::Neg, &UnaryRules::neg, "-x; gradient -dy", any, true},
      {UnaryOp::Exp, &UnaryRules::elementwise_unary_monotone, "e^x; gradient out dy", any, true},
      {UnaryOp::Log, &UnaryRules::elementwise_unary, "natural log; gradient dy / x", positive, false},
      {UnaryOp::Sqrt, &UnaryRules::elementwise_unary, "square root; gradient dy / (2 out)", positive, false},
      {UnaryOp::Rsqrt, &UnaryRules::elementwise_unary, "1 / sqrt(x); gradient -dy out^3 / 2", positive, false},
      {UnaryOp::Reciprocal, &UnaryRules::elementwise_unary, "1 / x; gradient -dy out^2", positive, false},
      {UnaryOp::Sin, &UnaryRules::elementwise_unary, "sin x; gradient dy cos x", any, false},
      {UnaryOp::Cos, &UnaryRules::elementwise_unary, "cos x; gradient -dy sin x", any, false},
      {UnaryOp::Tanh, &UnaryRules::elementwise_unary_monotone, "tanh x; gradient dy (1 - out^2)", any, false},
      {UnaryOp::Sigmoid, &UnaryRules::elementwise_unary_monotone, "1 / (1 + e^-x); gradient dy out (1 - out)", any, false},
      {UnaryOp::Relu, &UnaryRules::elementwise_unary_monotone, "max(x, 0); gradient dy where x > 0 (0 at x = 0)", any,
       true},
      {UnaryOp::Gelu, &UnaryRules::elementwise_unary,
       "GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))", any, true},
      {UnaryOp::Silu, &UnaryRules::elementwise_unary, "x sigmoid(x); gradient dy s (1 + x (1 - s))", any, false},
      {UnaryOp::Square, &UnaryRules::elementwise_unary, "x^2; gradient 2 x dy", any, false},
      {UnaryOp::Sign, &UnaryRules::elementwise_unary_monotone, "-1, 0 or 1 (0 for NaN); gradient 0", any, false},
  };
  for (const UnarySpec& spec : specs) registry.add(make_unary(spec));
  registry.add(make_scale());
  registry.add(make_cast());
}

}  // namespace shardwise::ops
