// moe_mlp on CUDA: the router, dispatch plan, row gather and weighted combine of cuda/moe.h with
// each expert's SwiGLU chain as cuBLASLt GEMMs (cuda/matmul.h) and swiglu (cuda/elementwise.h) over
// its rows, as ops::moe_forward / moe_backward compute them on one device. Tokens or experts split
// over ranks need the all-gathers and all_to_all_v of the CPU kernel on device memory, which are not
// built: an Error naming them. The backward recomputes the routing and the experts' hidden values.
#include "shardwise/core/error.h"
#include "shardwise/cuda/tensor_ops/elementwise.h"
#include "shardwise/cuda/tensor_ops/layout.h"
#include "shardwise/cuda/gemm/matmul.h"
#include "shardwise/cuda/layers/moe.h"
#include "shardwise/cuda_ops/families.h"
#include "shardwise/ops/moe/kernels.h"
#include "shardwise/tensor/current_stream.h"
#include "shardwise/tensor/device_copy.h"

namespace shardwise::cuda_ops {

namespace {

cuda::MoeRouterConfig router_config(const OpDef& op, In in, const Attrs& attrs, const KernelContext* ctx) {
  if (ctx != nullptr && ctx->tensors.size() >= 5 &&
      (ctx->group_sharding(0, 1u, op.name) != nullptr || ctx->group_sharding(2, 1u, op.name) != nullptr)) {
    unsupported(op, in[0],
                "tokens or experts split over ranks (the all-gathers of the router's counts and the all_to_all_v "
                "of the rows): no collective on CUDA device memory is built");
  }
  const ops::MoeConfig c = ops::moe_config(attrs, in[1].shape()[0]);
  return {c.top_k, c.capacity_factor, c.normalize, c.sigmoid};
}

// Expert e's [F, d] (w1, w3) or [d, F] (w2) matrix of the stacked weights [E, ., .].
Tensor expert_matrix(const Tensor& w, int64_t e) {
  const Shape& s = w.shape();
  const std::array<int64_t, 3> starts{e, 0, 0}, sizes{1, s[1], s[2]};
  return cuda::slice(w, starts, sizes, current_stream()).reshaped(Shape{s[1], s[2]});
}

// One expert's forward on its rows X: h1 = X w1ᵀ, h3 = X w3ᵀ, a = silu(h1) * h3, y = a w2ᵀ.
struct ExpertPass {
  Tensor x, w1, w3, w2, h1, h3, a, y;
};
ExpertPass expert_forward(const Tensor& rows, int64_t r0, int64_t m, In in, int64_t e) {
  const cuda::MatmulOptions t{.trans_y = true};
  ExpertPass p;
  const std::array<int64_t, 2> starts{r0, 0}, sizes{m, rows.shape()[1]};
  p.x = cuda::slice(rows, starts, sizes, current_stream());
  p.w1 = expert_matrix(in[2], e), p.w3 = expert_matrix(in[3], e), p.w2 = expert_matrix(in[4], e);
  p.h1 = cuda::matmul(p.x, p.w1, t, current_stream());
  p.h3 = cuda::matmul(p.x, p.w3, t, current_stream());
  p.a = cuda::swiglu(p.h1, p.h3, current_stream());
  p.y = cuda::matmul(p.a, p.w2, t, current_stream());
  return p;
}

// `parts` joined along dim 0, or an empty [0, cols] tensor when there are none.
Tensor joined(const Tensors& parts, const Tensor& like, int64_t cols) {
  if (parts.empty()) return empty_on(like.dtype(), Shape{0, cols}, like.device(), current_stream());
  return cuda::concat(parts, 0, current_stream());
}

// The rows each expert's forward gave, in the plan's order (experts in order).
Tensor experts_output(const cuda::MoeDispatch& d, const Tensor& rows, In in) {
  Tensors ys;
  int64_t r0 = 0;
  for (size_t e = 0; e < d.expert_rows.size(); ++e) {
    const int64_t m = d.expert_rows[e];
    if (m == 0) continue;
    ys.push_back(expert_forward(rows, r0, m, in, static_cast<int64_t>(e)).y);
    r0 += m;
  }
  return joined(ys, rows, rows.shape()[1]);
}

Tensors moe_forward(const OpDef& op, In in, const Attrs& attrs, const KernelContext* ctx) {
  const cuda::MoeRouting r = cuda::moe_route(in[0], in[1], router_config(op, in, attrs, ctx), current_stream());
  const cuda::MoeDispatch d = cuda::moe_plan(r, current_stream());
  const Tensor y = experts_output(d, cuda::moe_gather(in[0], d, current_stream()), in);
  return Tensors{cuda::moe_combine(y, d, r, current_stream()), r.aux_loss, r.z_loss, r.dropped, r.expert_tokens};
}

// The experts' weight gradients [E, ., .] and their input rows' gradient [rows, d].
struct ExpertGrads {
  Tensors dw1, dw3, dw2, dx;
};
void expert_backward(const ExpertPass& p, const Tensor& dy, ExpertGrads& g) {
  const cuda::MatmulOptions t{.trans_y = true};
  const cuda::MatmulGrads g2 = cuda::matmul_backward(p.a, p.w2, dy, t, true, true, current_stream());
  const cuda::SwigluGrads gs = cuda::swiglu_backward(p.h1, p.h3, g2.dx, current_stream());
  const cuda::MatmulGrads g1 = cuda::matmul_backward(p.x, p.w1, gs.dgate, t, true, true, current_stream());
  const cuda::MatmulGrads g3 = cuda::matmul_backward(p.x, p.w3, gs.dup, t, true, true, current_stream());
  auto stacked = [](const Tensor& w) { return w.reshaped(Shape{1, w.shape()[0], w.shape()[1]}); };
  g.dw1.push_back(stacked(g1.dy)), g.dw3.push_back(stacked(g3.dy)), g.dw2.push_back(stacked(g2.dy));
  g.dx.push_back(cuda::binary(cuda::Binary::Add, g1.dx, g3.dx, current_stream()));
}

ExpertGrads experts_backward(const cuda::MoeDispatch& d, const Tensor& rows, const Tensor& dy, In in) {
  ExpertGrads g;
  int64_t r0 = 0;
  for (size_t e = 0; e < d.expert_rows.size(); ++e) {
    const int64_t m = d.expert_rows[e];
    if (m == 0) {  // an expert without rows: zero weight gradients
      for (auto [w, list] : {std::pair{&in[2], &g.dw1}, std::pair{&in[3], &g.dw3}, std::pair{&in[4], &g.dw2}}) {
        const Shape& s = w->shape();
        list->push_back(zeros_on(w->dtype(), Shape{1, s[1], s[2]}, w->device(), current_stream()));
      }
      continue;
    }
    const std::array<int64_t, 2> starts{r0, 0}, sizes{m, dy.shape()[1]};
    expert_backward(expert_forward(rows, r0, m, in, static_cast<int64_t>(e)),
                    cuda::slice(dy, starts, sizes, current_stream()), g);
    r0 += m;
  }
  return g;
}

Tensors moe_backward(const OpDef& op, In in, In, In dout, const Attrs& attrs, const KernelContext* ctx,
                     std::span<const bool>) {
  const cuda::MoeRouting r = cuda::moe_route(in[0], in[1], router_config(op, in, attrs, ctx), current_stream());
  const cuda::MoeDispatch d = cuda::moe_plan(r, current_stream());
  const Tensor rows = cuda::moe_gather(in[0], d, current_stream());
  const cuda::MoeCombineGrad cg = cuda::moe_combine_backward(dout[0], experts_output(d, rows, in), d, r, current_stream());
  ExpertGrads g = experts_backward(d, rows, cg.dy, in);
  const Tensor dx_rows = joined(g.dx, rows, rows.shape()[1]);
  const cuda::MoeRouterGradResult rg = cuda::moe_router_backward(in[0], in[1], r, d, dx_rows, cg.dweight,
                                                                 dout.size() > 1 ? dout[1] : Tensor(),
                                                                 dout.size() > 2 ? dout[2] : Tensor(), current_stream());
  return Tensors{rg.dx, rg.dgate, cuda::concat(g.dw1, 0, current_stream()), cuda::concat(g.dw3, 0, current_stream()),
                 cuda::concat(g.dw2, 0, current_stream())};
}

}  // namespace

void bind_moe(ops::DeviceKernelTable& t) {
  t.add_forward("moe_mlp", moe_forward);
  t.add_backward("moe_mlp", moe_backward);
}

}  // namespace shardwise::cuda_ops
