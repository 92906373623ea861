// The SPMD rule of moe_mlp, hand-written: what it says is not a factor description. The expert
// dim of w1 / w3 / w2 may stay sharded (expert parallelism) only because the kernel moves tokens
// to their experts' ranks with all_to_all_v, and that needs the tokens split over the same mesh
// dims (each token on one rank of the expert group); the aux loss and capacity are global, so the
// kernel all-gathers per-expert sums over the token-sharding dims and the losses come out
// Replicate, not Partial.
//
// Inputs x [N, d], gate [E, d], w1 [E, F, d], w3 [E, F, d], w2 [E, d, F]; outputs out [N, d],
// aux_loss [], z_loss [], dropped [].
//  - X: the mesh dims sharding w1's expert dim (w1 wins over w3 and w2, which follow it);
//  - T: the mesh dims sharding x's token dim, then those of X it lacks (appended: a local slice
//    of a replicated x). Every other dim and every Partial -> R; gate R.
//  - out like x; aux_loss, z_loss, dropped R.
//  - Grad: inputs as forward, forward outputs and every output gradient but dout R, dout like x;
//    dx like x; dgate P(sum) on T (each token block's share); dw1/dw3/dw2 S(0) on X, P(sum) on
//    T \ X (each expert group saw its own tokens).
//  - Reverse: the wanted out's token sharding, with w1's given expert sharding kept where it is
//    within it.
#include "shardwise/ops/moe/rules.h"

#include "shardwise/ops/moe/kernels.h"

namespace shardwise::ops {

namespace {

using mesh::MeshDimList;
using spmd::DistAttr;
using spmd::Placement;
using spmd::ProcessMesh;
using spmd::SpmdResult;
using spmd::TensorSpec;

constexpr std::string_view kMoe = "moe_mlp";

void check_specs(const ProcessMesh& mesh, std::span<const TensorSpec> in) {
  spmd::check_inputs(kMoe, mesh, in.subspan(0, 5), 5);
  std::array<DType, 5> dtypes{in[0].dtype, in[1].dtype, in[2].dtype, in[3].dtype, in[4].dtype};
  check_moe_inputs(in[0].shape, in[1].shape, in[2].shape, in[3].shape, in[4].shape, dtypes);
}

DistAttr sharded_on(int nd, int tensor_dim, const MeshDimList& dims) {
  DistAttr d(nd);
  if (!dims.empty()) d.set_shard_order(tensor_dim, dims);
  return d;
}

// The layout for tokens over `tokens` and experts over `experts` (the expert dims are added to the
// token dims).
SpmdResult layout(int nd, MeshDimList tokens, const MeshDimList& experts) {
  for (int8_t m : experts) {
    if (!tokens.contains(m)) tokens.push_back(m);
  }
  DistAttr x = sharded_on(nd, 0, tokens), w = sharded_on(nd, 0, experts), r(nd);
  return {{x, r, w, w, w}, {x, r, r, r}};
}

SpmdResult moe_forward_rule(const ProcessMesh& mesh, std::span<const TensorSpec> in, const Attrs&) {
  check_specs(mesh, in);
  return layout(mesh.ndim(), in[0].dist.mesh_dims_of(0), in[2].dist.mesh_dims_of(0));
}

SpmdResult moe_reverse_rule(const ProcessMesh& mesh, std::span<const TensorSpec> in, std::span<const TensorSpec> out,
                            const Attrs&) {
  check_specs(mesh, in);
  spmd::check_inputs(kMoe, mesh, out, 4);
  const MeshDimList tokens = out[0].dist.mesh_dims_of(0);
  MeshDimList experts;
  for (int8_t m : in[2].dist.mesh_dims_of(0)) {
    if (tokens.contains(m)) experts.push_back(m);
  }
  return layout(mesh.ndim(), tokens, experts);
}

SpmdResult moe_grad_rule(const ProcessMesh& mesh, std::span<const TensorSpec> g, const Attrs&) {
  spmd::check_inputs(kMoe, mesh, g, 13);
  check_specs(mesh, g);
  const int nd = mesh.ndim();
  SpmdResult fwd = layout(nd, g[0].dist.mesh_dims_of(0), g[2].dist.mesh_dims_of(0));
  const DistAttr& x = fwd.inputs[0];
  const DistAttr& w = fwd.inputs[2];
  DistAttr r(nd), dgate(nd), dw = w;
  for (int8_t m : x.mesh_dims_of(0)) {
    dgate.set(m, Placement::partial());
    if (!w[m].is_shard()) dw.set(m, Placement::partial());
  }
  SpmdResult out;
  out.inputs = fwd.inputs;
  out.inputs.insert(out.inputs.end(), {x, r, r, r});  // forward outputs (not read)
  out.inputs.insert(out.inputs.end(), {x, r, r, r});  // dout, daux, dz, ddropped (not read)
  out.outputs = {x, dgate, dw, dw, dw};
  return out;
}

}  // namespace

MoeRules moe_rules() {
  MoeRules r;
  r.moe_mlp.name = std::string(kMoe);
  r.moe_mlp.summary =
      "x [N, d], gate [E, d], w1/w3 [E, F, d], w2 [E, d, F]: the experts' dim E keeps w1's sharding (expert "
      "parallelism; w3, w2 follow), x's token dim keeps its sharding plus every mesh dim sharding E (tokens go to "
      "their experts' ranks by all_to_all_v), all else and every Partial -> R, gate R; out like x, aux_loss, z_loss, "
      "dropped R (the kernel gathers the global sums). Grad: dout like x, other output grads R; dx like x, dgate "
      "P(sum) on the token dims, dw S(E) on the expert dims and P(sum) on the other token dims";
  r.moe_mlp.forward = moe_forward_rule;
  r.moe_mlp.reverse = moe_reverse_rule;
  r.moe_mlp.grad = moe_grad_rule;
  return r;
}

}  // namespace shardwise::ops
