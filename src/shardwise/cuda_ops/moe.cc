// moe_mlp on CUDA: the router, dispatch plan, row gather and weighted combine of cuda/moe.h with
// each expert's SwiGLU chain as cuBLASLt GEMMs (cuda/blas.h) and swiglu (cuda/elementwise.h) over
// its rows, as ops::moe_forward / moe_backward compute them on one device. bf16 x, w1, w3, w2 with
// an f32 gate (--compute bf16): the router, gather and combine run on x widened to f32 (exact), and
// every expert GEMM reads bf16 operands with f32 compute and writes f32 (a, dy, dh1, dh3 rounded to
// bf16 where a GEMM reads them; dx and the experts' gradients rounded once at the end): the CPU
// op's rounding points (ops/moe/kernels.h). Tokens or experts split over ranks (moe_ranks.h): the
// counts all-gathered on device memory and read on the host once, the rows moved to the experts'
// ranks and back by all_to_all_pieces on device buffers; the backward moves x's rows out, the
// experts' outputs back (the combine's gradient needs them where the tokens are), the output
// gradient's rows out and the input gradient's rows back. Compiled, never run on a GPU. The
// backward recomputes the routing and the experts' hidden values.
#include "shardwise/core/error.h"
#include "shardwise/cuda/gemm/blas.h"
#include "shardwise/cuda/tensor_ops/elementwise.h"
#include "shardwise/cuda/tensor_ops/layout.h"
#include "shardwise/cuda/layers/moe.h"
#include "shardwise/cuda_ops/families.h"
#include "shardwise/cuda_ops/moe_ranks.h"
#include "shardwise/ops/moe/kernels.h"
#include "shardwise/tensor/current_stream.h"
#include "shardwise/tensor/device_copy.h"

namespace shardwise::cuda_ops {

namespace {

cuda::MoeRouterConfig router_config(In in, const Attrs& attrs) {
  const ops::MoeConfig c = ops::moe_config(attrs, in[1].shape()[0]);
  return {c.top_k, c.capacity_factor, c.normalize, c.sigmoid};
}

// The five inputs' dtypes checked as the CPU op checks them (ops::check_moe_dtypes), before any launch.
void check_inputs(In in) {
  ops::check_moe_dtypes(std::array<DType, 5>{in[0].dtype(), in[1].dtype(), in[2].dtype(), in[3].dtype(), in[4].dtype()});
}

// x as the router, gather and combine read it: bf16 x widened to f32 (exact); others as they are.
Tensor router_x(const Tensor& x) { return x.dtype() == DType::BF16 ? cuda::cast(x, DType::F32, current_stream()) : x; }

// t as an expert GEMM's operand in the experts' dtype `in` (f32, or bf16: rounded once).
Tensor operand(const Tensor& t, DType in) { return t.dtype() == in ? t : cuda::cast(t, in, current_stream()); }

// c [m, n] f32 = op(a) op(b) (+ c when `accumulate`): a and b of one dtype (f32, or bf16 with f32
// compute), row-major, a stored [k, m] when ta, b stored [n, k] when tb.
void gemm_into(const Tensor& a, const Tensor& b, bool ta, bool tb, Tensor& c, int64_t k, bool accumulate) {
  const int64_t m = c.shape()[0], n = c.shape()[1];
  const cuda::GemmSpec spec{.in = a.dtype(), .out = DType::F32, .trans_a = ta, .trans_b = tb, .m = m, .n = n, .k = k,
                            .beta = accumulate ? 1.0f : 0.0f};
  cuda::gemm(a.device(), current_stream(), spec, a.device_ptr(), b.device_ptr(), c.device_ptr());
}
Tensor gemm(const Tensor& a, const Tensor& b, bool ta, bool tb, int64_t m, int64_t n, int64_t k) {
  Tensor c = empty_on(DType::F32, Shape{m, n}, a.device(), current_stream());
  gemm_into(a, b, ta, tb, c, k, false);
  return c;
}

// Expert e's [F, d] (w1, w3) or [d, F] (w2) matrix of the stacked weights [E, ., .].
Tensor expert_matrix(const Tensor& w, int64_t e) {
  const Shape& s = w.shape();
  const std::array<int64_t, 3> starts{e, 0, 0}, sizes{1, s[1], s[2]};
  return cuda::slice(w, starts, sizes, current_stream()).reshaped(Shape{s[1], s[2]});
}

// One expert's forward on its rows X (the operand dtype): h1 = X w1ᵀ, h3 = X w3ᵀ (f32),
// a = silu(h1) * h3 (f32; `a_in` its operand), y = a w2ᵀ (f32).
struct ExpertPass {
  Tensor x, w1, w3, w2, h1, h3, a_in, y;
  int64_t m = 0, d = 0, f = 0;
};
ExpertPass expert_forward(const Tensor& rows, int64_t r0, int64_t m, In in, int64_t e) {
  ExpertPass p;
  p.m = m, p.d = rows.shape()[1], p.f = in[2].shape()[1];
  const std::array<int64_t, 2> starts{r0, 0}, sizes{m, p.d};
  p.x = cuda::slice(rows, starts, sizes, current_stream());
  p.w1 = expert_matrix(in[2], e), p.w3 = expert_matrix(in[3], e), p.w2 = expert_matrix(in[4], e);
  p.h1 = gemm(p.x, p.w1, false, true, m, p.f, p.d);
  p.h3 = gemm(p.x, p.w3, false, true, m, p.f, p.d);
  p.a_in = operand(cuda::swiglu(p.h1, p.h3, current_stream()), rows.dtype());
  p.y = gemm(p.a_in, p.w2, false, true, m, p.d, p.f);
  return p;
}

// `parts` joined along dim 0, or an empty [0, cols] tensor of `dtype` when there are none.
Tensor joined(const Tensors& parts, DType dtype, Device device, int64_t cols) {
  if (parts.empty()) return empty_on(dtype, Shape{0, cols}, device, current_stream());
  return cuda::concat(parts, 0, current_stream());
}

// The rows each local expert's forward gave (f32), expert-major (each expert's `expert_rows`).
Tensor experts_output(const std::vector<int64_t>& expert_rows, const Tensor& rows, In in) {
  Tensors ys;
  int64_t r0 = 0;
  for (size_t e = 0; e < expert_rows.size(); ++e) {
    const int64_t m = expert_rows[e];
    if (m == 0) continue;
    ys.push_back(expert_forward(rows, r0, m, in, static_cast<int64_t>(e)).y);
    r0 += m;
  }
  return joined(ys, DType::F32, rows.device(), rows.shape()[1]);
}

// The local experts' input rows [rows, d] in the experts' dtype, expert-major (gathered from f32 x
// and moved as f32; bf16 rows: exact).
Tensor expert_rows(const Tensor& x32, const MoeRouted& routed, DType in) {
  return operand(moe_to_experts(routed, cuda::moe_gather(x32, routed.d, current_stream())), in);
}

Tensors moe_forward(const OpDef& op, In in, const Attrs& attrs, const KernelContext* ctx) {
  check_inputs(in);
  const Tensor x32 = router_x(in[0]);
  const MoeRouted routed = moe_route_call(op, in, x32, router_config(in, attrs), ctx);
  const Tensor y = moe_from_experts(routed, experts_output(routed.expert_rows, expert_rows(x32, routed, in[0].dtype()), in));
  const cuda::MoeRouting& r = routed.r;
  return Tensors{cuda::moe_combine(y, routed.d, r, current_stream()), r.aux_loss, r.z_loss, r.dropped, r.expert_tokens};
}

// The experts' weight gradients [1, ., .] each (f32) and their input rows' gradient [rows, d] (f32).
struct ExpertGrads {
  Tensors dw1, dw3, dw2, dx;
};
void expert_backward(const ExpertPass& p, const Tensor& dy, ExpertGrads& g) {
  const DType in = p.x.dtype();
  const Tensor dy_in = operand(dy, in);
  const Tensor da = gemm(dy_in, p.w2, false, false, p.m, p.f, p.d);        // da = dy w2
  Tensor dw2 = gemm(dy_in, p.a_in, true, false, p.d, p.f, p.m);            // dw2 = dyᵀ a
  const cuda::SwigluGrads gs = cuda::swiglu_backward(p.h1, p.h3, da, current_stream());
  const Tensor dh1 = operand(gs.dgate, in), dh3 = operand(gs.dup, in);
  Tensor dw1 = gemm(dh1, p.x, true, false, p.f, p.d, p.m);                 // dw1 = dh1ᵀ x
  Tensor dw3 = gemm(dh3, p.x, true, false, p.f, p.d, p.m);                 // dw3 = dh3ᵀ x
  Tensor dx = gemm(dh1, p.w1, false, false, p.m, p.d, p.f);                // dx = dh1 w1
  gemm_into(dh3, p.w3, false, false, dx, p.f, true);                       //    + dh3 w3
  auto stacked = [](const Tensor& w) { return w.reshaped(Shape{1, w.shape()[0], w.shape()[1]}); };
  g.dw1.push_back(stacked(dw1)), g.dw3.push_back(stacked(dw3)), g.dw2.push_back(stacked(dw2));
  g.dx.push_back(dx);
}

ExpertGrads experts_backward(const std::vector<int64_t>& expert_rows, const Tensor& rows, const Tensor& dy, In in) {
  ExpertGrads g;
  int64_t r0 = 0;
  for (size_t e = 0; e < expert_rows.size(); ++e) {
    const int64_t m = expert_rows[e];
    if (m == 0) {  // an expert without rows: zero weight gradients
      for (auto [w, list] : {std::pair{&in[2], &g.dw1}, std::pair{&in[3], &g.dw3}, std::pair{&in[4], &g.dw2}}) {
        const Shape& s = w->shape();
        list->push_back(zeros_on(DType::F32, Shape{1, s[1], s[2]}, w->device(), current_stream()));
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

// An f32 gradient in the dtype of the input it belongs to (bf16: rounded once).
Tensor as_input(const Tensor& g, const Tensor& input) { return operand(g, input.dtype()); }

Tensors moe_backward(const OpDef& op, In in, In, In dout, const Attrs& attrs, const KernelContext* ctx,
                     std::span<const bool>) {
  check_inputs(in);
  const Tensor x32 = router_x(in[0]);
  const MoeRouted routed = moe_route_call(op, in, x32, router_config(in, attrs), ctx);
  const cuda::MoeRouting& r = routed.r;
  const cuda::MoeDispatch& d = routed.d;
  const Tensor rows = expert_rows(x32, routed, in[0].dtype());
  const Tensor y = moe_from_experts(routed, experts_output(routed.expert_rows, rows, in));
  const cuda::MoeCombineGrad cg = cuda::moe_combine_backward(dout[0], y, d, r, current_stream());
  ExpertGrads g = experts_backward(routed.expert_rows, rows, moe_to_experts(routed, cg.dy), in);
  const Tensor dx_rows = moe_from_experts(routed, joined(g.dx, DType::F32, rows.device(), rows.shape()[1]));
  const cuda::MoeRouterGradResult rg = cuda::moe_router_backward(x32, in[1], r, d, dx_rows, cg.dweight,
                                                                 dout.size() > 1 ? dout[1] : Tensor(),
                                                                 dout.size() > 2 ? dout[2] : Tensor(), current_stream());
  auto stacked = [&](const Tensors& parts, const Tensor& w) {
    return as_input(cuda::concat(parts, 0, current_stream()), w);
  };
  return Tensors{as_input(rg.dx, in[0]), rg.dgate, stacked(g.dw1, in[2]), stacked(g.dw3, in[3]), stacked(g.dw2, in[4])};
}

}  // namespace

void bind_moe(ops::DeviceKernelTable& t) {
  t.add_forward("moe_mlp", moe_forward);
  t.add_backward("moe_mlp", moe_backward);
}

}  // namespace shardwise::cuda_ops
