// The matmul op's registry entry: shape inference, kernels (kernels.h), rule (rules.h) and the
// verification cases.
#include <algorithm>
#include <array>
#include <cstring>

#include "shardwise/ops/families.h"
#include "shardwise/ops/matmul/rules.h"
#include "shardwise/ops/matmul/kernels.h"
#include "shardwise/tensor/gemm.h"

namespace shardwise::ops {

namespace {

std::vector<TensorMeta> matmul_infer(std::span<const TensorMeta> in, const Attrs& attrs) {
  MatmulDims d = matmul_checked_dims(in[0].shape, in[0].dtype, in[1].shape, in[1].dtype, attrs);
  return {TensorMeta{d.out, in[0].dtype}};
}

std::vector<Tensor> matmul_backward(std::span<const Tensor> in, std::span<const Tensor> /*outputs*/,
                                    std::span<const Tensor> out_grads, const Attrs& attrs) {
  return matmul_grads(in, out_grads, attrs, true, true);
}

VerifyCase make_case(Shape x, Shape y, DType dtype, bool trans_x = false, bool trans_y = false) {
  VerifyCase c;
  c.shapes = {x, y};
  c.dtypes = {dtype, dtype};
  if (trans_x) c.attrs.set("trans_x", true);
  if (trans_y) c.attrs.set("trans_y", true);
  return c;
}

std::vector<VerifyCase> matmul_cases() {
  return {
      make_case({12, 6}, {6, 12}, DType::F64),                 // every dim divides every test mesh
      make_case({5, 7}, {7, 3}, DType::F64),                   // uneven shards
      make_case({6, 2}, {2, 5}, DType::F64),                   // k = 2 < 3: empty k shards give zeros
      make_case({7, 5}, {7, 3}, DType::F64, true, false),      // trans_x: x is [k, m]
      make_case({5, 7}, {3, 7}, DType::F32, false, true),      // trans_y: y is [n, k]; f32
      make_case({2, 5, 3}, {3, 4}, DType::F64),                // batched x, broadcast y
      make_case({1, 4, 3}, {2, 3, 5}, DType::F64),             // size-1 batch dim broadcast
      make_case({7}, {7, 3}, DType::F64),                      // 1-D x: row vector
      make_case({5, 7}, {7}, DType::F64),                      // 1-D y: column vector
      make_case({12}, {12}, DType::F64),                       // dot product; 12 divides every mesh size
      make_case({2, 7, 3}, {2, 4, 7}, DType::I64, true, true), // exact integers, both transposed
  };
}

}  // namespace

void register_matmul_ops(OpRegistry& registry) {
  OpDef op;
  op.name = "matmul";
  op.family = "matmul";
  op.rule = rules_of<matmul_rules>().matmul;
  op.summary =
      "matmul(x, y; trans_x, trans_y): x [..., m, k] * y [..., k, n] with broadcast batch dims; 1-D x / y are "
      "row / column vectors (their m / n dim dropped); f32/f64 via OpenBLAS, f16/bf16 widened onto the f32 GEMM (f32 "
      "accumulation, one rounding), i32/i64 reference loops";
  op.num_inputs = 2;
  op.num_outputs = 1;
  op.infer = matmul_infer;
  op.forward = matmul_forward;
  op.backward = matmul_backward;
  op.backward_partial = [](std::span<const Tensor> in, std::span<const Tensor>, std::span<const Tensor> out_grads,
                           const Attrs& attrs, std::span<const bool> wanted) {
    return matmul_grads(in, out_grads, attrs, wanted[0], wanted[1]);
  };
  op.backward_reads = std::vector<int>{0, 1};  // x and y; not the output
  op.cases = matmul_cases();
  registry.add(std::move(op));
}

}  // namespace shardwise::ops
