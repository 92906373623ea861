// The activation family's registry entries: swiglu (kernels.h, rule in rules.cc) and its
// verification cases.
#include "shardwise/ops/activation/kernels.h"
#include "shardwise/ops/activation/rules.h"
#include "shardwise/ops/families.h"

namespace shardwise::ops {

namespace {

VerifyCase pair(Shape shape, DType dtype) { return VerifyCase{{shape, shape}, {dtype, dtype}, {}, {}}; }

OpDef make_swiglu() {
  OpDef op;
  op.name = "swiglu";
  op.family = "activation";
  op.rule = rules_of<activation_rules>().swiglu;
  op.summary = "silu(gate) * up (Llama's SwiGLU MLP), gate and up of one shape and floating dtype";
  op.num_inputs = 2;
  op.infer = [](std::span<const TensorMeta> in, const Attrs&) {
    check_swiglu_inputs(in[0].shape, in[0].dtype, in[1].shape, in[1].dtype);
    return std::vector<TensorMeta>{in[0]};
  };
  op.forward = [](std::span<const Tensor> in, const Attrs&) { return std::vector<Tensor>{swiglu(in[0], in[1])}; };
  op.backward = [](std::span<const Tensor> in, std::span<const Tensor>, std::span<const Tensor> dout,
                   const Attrs&) {
    SwigluGrads g = swiglu_backward(in[0], in[1], dout[0]);
    return std::vector<Tensor>{g.dgate, g.dup};
  };
  op.backward_reads = std::vector<int>{0, 1};  // gate and up; not the output
  // Dims that divide every test mesh, uneven ones, one smaller than the mesh (empty shards), 3-D.
  op.cases = {pair({12, 6}, DType::F64), pair({5, 7}, DType::F64), pair({1, 5}, DType::F64),
              pair({2, 3, 4}, DType::F64), pair({12}, DType::F32)};
  return op;
}

}  // namespace

void register_activation_ops(OpRegistry& registry) { registry.add(make_swiglu()); }

}  // namespace shardwise::ops
