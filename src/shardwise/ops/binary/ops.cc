// The broadcasting binary elementwise ops and where(cond, x, y): registry entries (shape
// inference, kernels from kernels.h, gradients, SPMD rules from rules.cc)
// and their verification cases.
#include <string>
#include <utility>
#include <vector>

#include "shardwise/ops/families.h"
#include "shardwise/ops/binary/rules.h"
#include "shardwise/ops/binary/kernels.h"
#include "shardwise/tensor/broadcast.h"

namespace shardwise::ops {

namespace {

using Kind = ValueGen::Kind;

VerifyCase make_case(std::vector<Shape> shapes, DType dtype, std::vector<ValueGen> values = {}) {
  std::vector<DType> dtypes(shapes.size(), dtype);
  return VerifyCase{std::move(shapes), std::move(dtypes), {}, std::move(values)};
}

// Float cases every binary op gets: even (12x6 with 12x6; 12 with 12 splits evenly on every test
// mesh, co-sharded [2,2] included), uneven (5x7), broadcasts (12x6 with 6, 5x1 with 1x7, 1x7 with
// 5x7 in f32) and 3-D with 2-D where a dim of 2 leaves shards empty on a mesh dim of 3. `x` / `y`
// draw the values.
std::vector<VerifyCase> float_cases(ValueGen x, ValueGen y) {
  return {
      make_case({{12, 6}, {12, 6}}, DType::F64, {x, y}),
      make_case({{5, 7}, {5, 7}}, DType::F64, {x, y}),
      make_case({{12}, {12}}, DType::F64, {x, y}),
      make_case({{12, 6}, {6}}, DType::F64, {x, y}),
      make_case({{5, 1}, {1, 7}}, DType::F64, {x, y}),
      make_case({{1, 7}, {5, 7}}, DType::F32, {x, y}),
      make_case({{2, 3, 4}, {3, 1}}, DType::F64, {x, y}),
  };
}

// Integer cases with small values (frequent ties for maximum/minimum): uneven i64, and a 3-D
// broadcast in i32 with a dim of 2 (empty shards on a mesh dim of 3).
void add_int_cases(std::vector<VerifyCase>& cases) {
  ValueGen small{Kind::SmallInts, -5, 5};
  cases.push_back(make_case({{5, 7}, {5, 7}}, DType::I64, {small, small}));
  cases.push_back(make_case({{2, 1, 6}, {5, 1}}, DType::I32, {small, small}));
}

struct BinarySpec {
  BinaryOp op;
  spmd::Rule BinaryRules::*rule;
  const char* summary;
};

OpDef make_binary(const BinarySpec& spec, std::vector<VerifyCase> cases) {
  BinaryOp op = spec.op;
  OpDef def;
  def.name = std::string(binary_op_name(op));
  def.family = "binary";
  def.rule = rules_of<binary_rules>().*spec.rule;
  def.summary = spec.summary;
  def.num_inputs = 2;
  def.infer = [op](std::span<const TensorMeta> in, const Attrs&) {
    DType dtype = binary_result_dtype(op, in[0].dtype, in[1].dtype);
    return std::vector<TensorMeta>{{broadcast_shapes(in[0].shape, in[1].shape), dtype}};
  };
  def.forward = [op](std::span<const Tensor> in, const Attrs&) {
    return std::vector<Tensor>{binary(op, in[0], in[1])};
  };
  if (binary_op_has_gradient(op)) {
    def.backward = [op](std::span<const Tensor> in, std::span<const Tensor> out, std::span<const Tensor> dout,
                        const Attrs&) {
      BinaryGrads g = binary_backward(op, in[0], in[1], out[0], dout[0]);
      return std::vector<Tensor>{g.dx, g.dy};
    };
    // The gradients of add and subtract are +-dout reduced to each input's shape.
    if (op == BinaryOp::Add || op == BinaryOp::Subtract) def.backward_reads = std::vector<int>{};
  }
  def.cases = std::move(cases);
  return def;
}

OpDef make_where() {
  OpDef def;
  def.name = "where";
  def.family = "binary";
  def.rule = rules_of<binary_rules>().elementwise_where;
  def.summary = "where(cond, x, y) = cond ? x : y, all three broadcast together; cond bool, x and y one dtype; "
                "grad: dx = dout where cond, dy = dout where !cond (summed over broadcast dims), none for cond";
  def.num_inputs = 3;
  def.infer = [](std::span<const TensorMeta> in, const Attrs&) {
    DType dtype = where_result_dtype(in[0].dtype, in[1].dtype, in[2].dtype);
    return std::vector<TensorMeta>{{broadcast_shapes(in[0].shape, in[1].shape, in[2].shape), dtype}};
  };
  def.forward = [](std::span<const Tensor> in, const Attrs&) {
    return std::vector<Tensor>{where(in[0], in[1], in[2])};
  };
  def.backward = [](std::span<const Tensor> in, std::span<const Tensor>, std::span<const Tensor> dout,
                    const Attrs&) {
    BinaryGrads g = where_backward(in[0], in[1], in[2], dout[0]);
    return std::vector<Tensor>{Tensor(), g.dx, g.dy};
  };
  ValueGen coin{Kind::SmallInts, 0, 1};
  ValueGen uni{};
  auto where_case = [](std::vector<Shape> shapes, DType dtype, std::vector<ValueGen> values) {
    return VerifyCase{std::move(shapes), {DType::Bool, dtype, dtype}, {}, std::move(values)};
  };
  // The 3-input enumeration grows fast (~60k forward combinations for three rank-2 tensors on a
  // 2-D mesh), so every case gives one of the three a low rank.
  def.cases = {
      where_case({{12}, {12}, {12}}, DType::F64, {coin, uni, uni}),            // even on every mesh
      where_case({{5, 7}, {5, 7}, {7}}, DType::F64, {coin, uni, uni}),         // uneven, y broadcast
      where_case({{6}, {12, 1}, {12, 6}}, DType::F64, {coin, uni, uni}),       // cond and x broadcast
      where_case({{5, 1}, {1, 7}, {1}}, DType::F32, {coin, uni, uni}),         // all broadcast, f32
      where_case({{2, 1, 4}, {3, 1}, {4}}, DType::F64, {coin, uni, uni}),      // 3-D, empty shards
      where_case({{5, 7}, {7}, {5, 1}}, DType::I64, {coin, ValueGen{Kind::SmallInts, -5, 5},
                                                      ValueGen{Kind::SmallInts, -5, 5}}),
      where_case({{7}, {5, 7}, {5, 1}}, DType::Bool, {coin, coin, coin}),
  };
  return def;
}

}  // namespace

void register_binary_ops(OpRegistry& registry) {
  ValueGen uni{};
  ValueGen positive{Kind::Uniform, 0.5, 2.0};     // divisors, pow bases (ln x needs x > 0)
  ValueGen ties{Kind::SmallInts, -2, 2};          // maximum/minimum: frequent ties (half/half grads)

  auto arithmetic = [&](ValueGen x, ValueGen y) {
    std::vector<VerifyCase> cases = float_cases(x, y);
    add_int_cases(cases);
    return cases;
  };
  // max/min-like: one float case with ties, the rest uniform.
  auto selecting = [&] {
    std::vector<VerifyCase> cases = float_cases(uni, uni);
    cases[1].values = {ties, ties};
    cases[6].values = {ties, ties};
    add_int_cases(cases);
    return cases;
  };

  registry.add(make_binary({BinaryOp::Add, &BinaryRules::elementwise_add,
                            "x + y with NumPy broadcasting; float and integer dtypes (integers wrap); "
                            "grad: dout to both, summed over broadcast dims"},
                           arithmetic(uni, uni)));
  registry.add(make_binary({BinaryOp::Subtract, &BinaryRules::elementwise_add,
                            "x - y with NumPy broadcasting; float and integer dtypes (integers wrap); "
                            "grad: dx = dout, dy = -dout, summed over broadcast dims"},
                           arithmetic(uni, uni)));
  registry.add(make_binary({BinaryOp::Multiply, &BinaryRules::elementwise_multiply,
                            "x * y with NumPy broadcasting; float and integer dtypes (integers wrap); "
                            "grad: dx = dout*y, dy = dout*x, summed over broadcast dims"},
                           arithmetic(uni, uni)));
  registry.add(make_binary({BinaryOp::Divide, &BinaryRules::elementwise_divide,
                            "x / y with NumPy broadcasting; floating dtypes; grad: dx = dout/y, "
                            "dy = -dout*x/y^2, summed over broadcast dims"},
                           float_cases(uni, positive)));
  registry.add(make_binary({BinaryOp::Maximum, &BinaryRules::elementwise_max,
                            "elementwise max (NaN propagates); float and integer dtypes; grad to the "
                            "larger operand, split half/half on ties (PyTorch)"},
                           selecting()));
  registry.add(make_binary({BinaryOp::Minimum, &BinaryRules::elementwise_min,
                            "elementwise min (NaN propagates); float and integer dtypes; grad to the "
                            "smaller operand, split half/half on ties (PyTorch)"},
                           selecting()));
  registry.add(make_binary({BinaryOp::Fmax, &BinaryRules::elementwise_max,
                            "elementwise max ignoring NaN (numpy.fmax); float and integer dtypes; grad to "
                            "the selected operand, half/half on ties"},
                           selecting()));
  registry.add(make_binary({BinaryOp::Fmin, &BinaryRules::elementwise_min,
                            "elementwise min ignoring NaN (numpy.fmin); float and integer dtypes; grad to "
                            "the selected operand, half/half on ties"},
                           selecting()));
  registry.add(make_binary({BinaryOp::Atan2, &BinaryRules::elementwise_binary,
                            "atan2(x, y) = angle of the point (y, x) (numpy.arctan2); floating dtypes; "
                            "grad: dx = dout*y/(x^2+y^2), dy = -dout*x/(x^2+y^2)"},
                           float_cases(uni, uni)));
  registry.add(make_binary({BinaryOp::Pow, &BinaryRules::elementwise_binary,
                            "x ** y (tensor exponent); floating dtypes; grad: dx = dout*y*x^(y-1), "
                            "dy = dout*x^y*ln(x) (0 where x == 0 and y >= 0)"},
                           float_cases(positive, uni)));

  // Bitwise: integer and bool cases only; no gradient.
  auto bitwise_cases = [] {
    ValueGen small{Kind::SmallInts, -8, 8};
    ValueGen coin{Kind::SmallInts, 0, 1};
    return std::vector<VerifyCase>{
        make_case({{12, 6}, {12, 6}}, DType::I64, {small, small}),
        make_case({{12}, {12}}, DType::I32, {small, small}),
        make_case({{5, 7}, {5, 7}}, DType::I32, {small, small}),
        make_case({{5, 1}, {1, 7}}, DType::I64, {small, small}),
        make_case({{2, 3, 4}, {3, 1}}, DType::I32, {small, small}),
        make_case({{5, 7}, {7}}, DType::Bool, {coin, coin}),
        make_case({{2, 1}, {2, 6}}, DType::Bool, {coin, coin}),
    };
  };
  registry.add(make_binary({BinaryOp::BitwiseAnd, &BinaryRules::elementwise_binary,
                            "x & y with NumPy broadcasting; integer dtypes and bool (logical and); no gradient"},
                           bitwise_cases()));
  registry.add(make_binary({BinaryOp::BitwiseOr, &BinaryRules::elementwise_binary,
                            "x | y with NumPy broadcasting; integer dtypes and bool (logical or); no gradient"},
                           bitwise_cases()));
  registry.add(make_binary({BinaryOp::BitwiseXor, &BinaryRules::elementwise_binary,
                            "x ^ y with NumPy broadcasting; integer dtypes and bool (logical xor); no gradient"},
                           bitwise_cases()));

  registry.add(make_where());
}

}  // namespace shardwise::ops
