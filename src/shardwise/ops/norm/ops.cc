// The normalization ops layer_norm and rms_norm (kernels in kernels.h, rules in
// rules.cc). Attributes: begin_norm_axis (int, default -1: dims [k, ndim) are
// normalized), epsilon (float; 1e-5 for layer_norm, 1e-6 for rms_norm).
//   layer_norm(x, scale, bias) -> (out, mean, rstd);  rms_norm(x, scale) -> (out, inv_rms)
// scale / bias have the unflattened normalized shape x.shape[k:]; the statistics have x.shape[:k].
// The backward ignores the gradients of the statistics outputs (see kernels.h).
#include "shardwise/ops/families.h"
#include "shardwise/ops/norm/rules.h"
#include "shardwise/ops/norm/kernels.h"

namespace shardwise::ops {

namespace {

Attrs norm_attrs(int64_t begin_norm_axis) {
  Attrs a;
  a.set("begin_norm_axis", begin_norm_axis);
  return a;
}

// x of `shape`, plus `params` parameters of its normalized shape, all in `dtype`.
VerifyCase norm_case(Shape shape, int64_t k, DType dtype, int params) {
  VerifyCase vc;
  vc.attrs = norm_attrs(k);
  int kk = resolve_norm_axis(k, shape.ndim(), "norm case");
  vc.shapes.push_back(shape);
  for (int p = 0; p < params; ++p) vc.shapes.push_back(norm_trailing_shape(shape, kk));
  vc.dtypes.assign(vc.shapes.size(), dtype);
  return vc;
}

// Shapes: 12x6 divides meshes [2], [3], [2,3] and 4x12 divides [2], [2,2] (even); 5x7 does not
// (uneven); 1x6 and 2x3x4 have a leading dim smaller than a mesh dim (empty shards of rows).
// begin_norm_axis: the last dim, the last two dims (2x3x4, k = -2), and for rms_norm also 0
// (everything normalized, scalar statistics). f32 in one case; epsilon large enough to matter in
// another. layer_norm gets the fewest cases: its gradient check runs a distinct layout for almost
// every combination (bias and the ignored statistics' gradients keep their given layouts), about
// 20000 runs per case and mesh; its k = 0 path is covered by the unit tests.
std::vector<VerifyCase> norm_cases(int params) {
  const DType f64 = DType::F64;
  std::vector<VerifyCase> cases = {
      norm_case({12, 6}, -1, f64, params), norm_case({4, 12}, -1, DType::F32, params),
      norm_case({5, 7}, -1, f64, params),  norm_case({1, 6}, -1, f64, params),
      norm_case({2, 3, 4}, -2, f64, params),
  };
  cases[2].attrs.set("epsilon", 0.5);
  if (params == 1) cases.push_back(norm_case({2, 3}, 0, f64, params));
  return cases;
}

OpDef make_layer_norm() {
  OpDef def;
  def.name = "layer_norm";
  def.family = "norm";
  def.rule = rules_of<norm_rules>().layer_norm;
  def.summary =
      "layer_norm(x, scale, bias; begin_norm_axis=-1, epsilon=1e-5) -> (out, mean, rstd): normalizes dims [k, ndim) "
      "of x (biased variance), out = (x - mean) * rstd * scale + bias; scale/bias shaped x.shape[k:], mean/rstd "
      "x.shape[:k]. Gradient: dx, dscale, dbias; gradients of mean/rstd are ignored";
  def.num_inputs = 3;
  def.num_outputs = 3;
  def.infer = [](std::span<const TensorMeta> in, const Attrs& attrs) {
    int k = norm_begin_axis(attrs, in[0].shape.ndim(), "layer_norm");
    check_norm_param("layer_norm", "scale", in[0].shape, in[0].dtype, k, in[1].shape, in[1].dtype);
    check_norm_param("layer_norm", "bias", in[0].shape, in[0].dtype, k, in[2].shape, in[2].dtype);
    TensorMeta stat{norm_leading_shape(in[0].shape, k), norm_stat_dtype(in[0].dtype)};
    return std::vector<TensorMeta>{in[0], stat, stat};
  };
  def.forward = [](std::span<const Tensor> in, const Attrs& attrs) {
    int k = norm_begin_axis(attrs, in[0].ndim(), "layer_norm");
    LayerNormOutputs r = layer_norm(in[0], in[1], in[2], k, norm_epsilon(attrs, kLayerNormEpsilon));
    return std::vector<Tensor>{r.out, r.mean, r.rstd};
  };
  def.backward = [](std::span<const Tensor> in, std::span<const Tensor> out, std::span<const Tensor> dout,
                    const Attrs& attrs) {
    int k = norm_begin_axis(attrs, in[0].ndim(), "layer_norm");
    LayerNormGrads g = layer_norm_backward(in[0], in[1], out[1], out[2], dout[0], k);
    return std::vector<Tensor>{g.dx, g.dscale, g.dbias};
  };
  def.backward_reads = std::vector<int>{0, 1, 4, 5};  // x, scale, mean, rstd; not bias, not the output
  def.cases = norm_cases(2);
  return def;
}

OpDef make_rms_norm() {
  OpDef def;
  def.name = "rms_norm";
  def.family = "norm";
  def.rule = rules_of<norm_rules>().rms_norm;
  def.summary =
      "rms_norm(x, scale; begin_norm_axis=-1, epsilon=1e-6) -> (out, inv_rms): inv_rms = 1 / sqrt(mean(x^2) over "
      "dims [k, ndim) + epsilon), out = x * inv_rms * scale; scale shaped x.shape[k:], inv_rms x.shape[:k]. "
      "Gradient: dx, dscale; the gradient of inv_rms is ignored";
  def.num_inputs = 2;
  def.num_outputs = 2;
  def.infer = [](std::span<const TensorMeta> in, const Attrs& attrs) {
    int k = norm_begin_axis(attrs, in[0].shape.ndim(), "rms_norm");
    check_norm_param("rms_norm", "scale", in[0].shape, in[0].dtype, k, in[1].shape, in[1].dtype);
    return std::vector<TensorMeta>{in[0], {norm_leading_shape(in[0].shape, k), norm_stat_dtype(in[0].dtype)}};
  };
  def.forward = [](std::span<const Tensor> in, const Attrs& attrs) {
    int k = norm_begin_axis(attrs, in[0].ndim(), "rms_norm");
    RmsNormOutputs r = rms_norm(in[0], in[1], k, norm_epsilon(attrs, kRmsNormEpsilon));
    return std::vector<Tensor>{r.out, r.inv_rms};
  };
  def.backward = [](std::span<const Tensor> in, std::span<const Tensor> out, std::span<const Tensor> dout,
                    const Attrs& attrs) {
    int k = norm_begin_axis(attrs, in[0].ndim(), "rms_norm");
    RmsNormGrads g = rms_norm_backward(in[0], in[1], out[1], dout[0], k);
    return std::vector<Tensor>{g.dx, g.dscale};
  };
  def.cases = norm_cases(1);
  return def;
}

}  // namespace

void register_norm_ops(OpRegistry& registry) {
  registry.add(make_layer_norm());
  registry.add(make_rms_norm());
}

}  // namespace shardwise::ops
