// The unary op registry entries: names, rules, shape/dtype inference, kernels and case coverage.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "shardwise/ops/op.h"

namespace shardwise::ops {
namespace {

const std::vector<std::string> kUnaryOps = {"abs",  "neg",  "exp",     "log",  "sqrt", "rsqrt",
                                            "reciprocal", "sin", "cos", "tanh", "sigmoid", "relu",
                                            "gelu", "silu", "square", "sign", "scale", "cast"};

TEST(UnaryOps, RegisteredWithExistingRules) {
  for (const std::string& name : kUnaryOps) {
    const OpDef* op = op_registry().find(name);
    ASSERT_NE(op, nullptr) << name;
    EXPECT_EQ(op->family, "elementwise") << name;
    EXPECT_EQ(op->num_inputs, 1);
    EXPECT_EQ(op->num_outputs, 1);
    EXPECT_TRUE(op->backward) << name;
    EXPECT_NE(spmd::rules().find(op->rule), nullptr) << name << " names rule " << op->rule;
  }
  EXPECT_EQ(op_registry().get("neg").rule, "neg");
  EXPECT_EQ(op_registry().get("exp").rule, "elementwise_unary_monotone");
  EXPECT_EQ(op_registry().get("gelu").rule, "elementwise_unary");
}

TEST(UnaryOps, CasesCoverEvenUnevenAndEmptyShardsAndDtypes) {
  const std::set<std::string> with_ints = {"abs", "neg", "sign", "square", "scale", "cast"};
  for (const std::string& name : kUnaryOps) {
    const OpDef& op = op_registry().get(name);
    bool even = false, uneven = false, tiny = false, f32 = false, f64 = false, ints = false;
    for (const VerifyCase& c : op.cases) {
      ASSERT_EQ(c.shapes.size(), 1u) << name;
      ASSERT_EQ(c.dtypes.size(), 1u) << name;
      const Shape& s = c.shapes[0];
      EXPECT_LE(s.numel(), 100) << name;
      EXPECT_LE(s.ndim(), 3) << name;
      for (int64_t d : s) {
        even |= d % 12 == 0;
        uneven |= d == 5 || d == 7;
        tiny |= d <= 2;
      }
      f32 |= c.dtypes[0] == DType::F32;
      f64 |= c.dtypes[0] == DType::F64;
      ints |= is_integral(c.dtypes[0]);
      // Every case must be accepted by the op's own shape inference.
      std::vector<TensorMeta> in = {{s, c.dtypes[0]}};
      EXPECT_NO_THROW(infer_checked(op, in, c.attrs)) << name << " " << s.to_string();
    }
    EXPECT_TRUE(even && uneven && tiny) << name;
    EXPECT_TRUE(f32 && f64) << name;
    EXPECT_EQ(ints, with_ints.count(name) == 1) << name;
  }
}

TEST(UnaryOps, InferChecksDtypesAndAttrs) {
  std::vector<TensorMeta> i32 = {{Shape{3}, DType::I32}};
  EXPECT_THROW(infer_checked(op_registry().get("exp"), i32, {}), Error);
  EXPECT_EQ(infer_checked(op_registry().get("abs"), i32, {})[0].dtype, DType::I32);
  EXPECT_THROW(infer_checked(op_registry().get("scale"), i32, Attrs{{"scale", 0.5}}), Error);
  const OpDef& cast = op_registry().get("cast");
  std::vector<TensorMeta> out = infer_checked(cast, i32, Attrs{{"dtype", std::string("bf16")}});
  EXPECT_EQ(out[0].dtype, DType::BF16);
  EXPECT_EQ(out[0].shape, Shape{3});
  EXPECT_THROW(infer_checked(cast, i32, {}), Error);
  std::vector<TensorMeta> two = {{Shape{3}, DType::F32}, {Shape{3}, DType::F32}};
  EXPECT_THROW(infer_checked(op_registry().get("relu"), two, {}), Error);
}

TEST(UnaryOps, KernelsThroughTheRegistry) {
  Tensor x = Tensor::from<double>(Shape{3}, std::vector<double>{-1.0, 0.5, 2.0});
  std::vector<Tensor> in = {x};
  const OpDef& scale = op_registry().get("scale");
  Attrs attrs{{"scale", 2.0}, {"bias", 1.0}, {"bias_after_scale", false}};
  std::vector<Tensor> out = scale.forward(in, attrs);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].at(0), 0.0);  // 2 * (-1 + 1)
  EXPECT_EQ(out[0].at(2), 6.0);
  std::vector<Tensor> dy = {Tensor::full(DType::F64, Shape{3}, 1.5)};
  std::vector<Tensor> dx = scale.backward(in, out, dy, attrs);
  ASSERT_EQ(dx.size(), 1u);
  EXPECT_EQ(dx[0].at(1), 3.0);

  const OpDef& relu = op_registry().get("relu");
  std::vector<Tensor> r = relu.forward(in, {});
  EXPECT_EQ(r[0].at(0), 0.0);
  EXPECT_EQ(relu.backward(in, r, dy, {})[0].at(2), 1.5);

  const OpDef& cast = op_registry().get("cast");
  Attrs to_i8{{"dtype", std::string("i8")}};
  std::vector<Tensor> c = cast.forward(in, to_i8);
  EXPECT_EQ(c[0].dtype(), DType::I8);
  std::vector<Tensor> cdy = {Tensor::full(DType::I8, Shape{3}, 2)};
  Tensor cdx = cast.backward(in, c, cdy, to_i8)[0];
  EXPECT_EQ(cdx.dtype(), DType::F64);
  EXPECT_EQ(cdx.at(0), 2.0);
  std::vector<Tensor> ints = {Tensor::full(DType::I32, Shape{2}, 3)};
  EXPECT_FALSE(cast.backward(ints, cast.forward(ints, to_i8), cdy, to_i8)[0].defined());
}

}  // namespace
}  // namespace shardwise::ops
