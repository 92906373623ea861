#include "shardwise/cuda/layers/moe.h"

#include <cmath>
#include <utility>

#include "shardwise/cuda/memory/cuda_memory.h"
#include "shardwise/cuda/common/kernel_args.h"
#include "shardwise/cuda/common/launchers.h"
#include "shardwise/tensor/device_copy.h"

namespace shardwise::cuda {

using namespace detail;  // kernel_args.h

namespace {

double* f64(Tensor& t) { return static_cast<double*>(t.device_ptr()); }
const double* f64(const Tensor& t) { return static_cast<const double*>(t.device_ptr()); }
int64_t* i64(Tensor& t) { return static_cast<int64_t*>(t.device_ptr()); }
const int64_t* i64(const Tensor& t) { return static_cast<const int64_t*>(t.device_ptr()); }

launch::MoeDims dims_of(const MoeRouting& r, int64_t hidden) {
  return {r.probs.shape()[0], hidden, r.probs.shape()[1], r.config.top_k};
}

// Error naming the kernel unless `t` is f32 [rows, hidden] on `dev`.
void need_rows(std::string_view kernel, std::string_view arg, const Tensor& t, Device dev, int64_t rows, int64_t hidden) {
  need_f32(kernel, arg, t, dev, Shape{rows, hidden});
}

const float* scalar_or_null(std::string_view kernel, std::string_view arg, const Tensor& t, Device dev) {
  if (!t.defined()) return nullptr;
  need_f32(kernel, arg, t, dev, Shape{});
  return f(t);
}

}  // namespace

MoeRouting moe_route(const Tensor& x, const Tensor& gate, const MoeRouterConfig& config, Stream stream) {
  const Device dev = x.device();
  need("moe_route", "x", x, DType::F32, dev);
  need("moe_route", "gate", gate, DType::F32, dev);
  SW_CHECK(x.ndim() == 2 && gate.ndim() == 2 && gate.shape()[1] == x.shape()[1],
           "cuda moe_route: x must be [tokens, hidden] and gate [experts, hidden], got x {} and gate {}",
           x.shape().to_string(), gate.shape().to_string());
  const int64_t N = x.shape()[0], E = gate.shape()[0], k = config.top_k;
  SW_CHECK(E >= 1 && E <= 1024, "cuda moe_route: {} experts (the kernels take 1..1024)", E);
  SW_CHECK(k >= 1 && k <= E, "cuda moe_route: top_k = {} must be in [1, experts = {}]", k, E);
  SW_CHECK(config.capacity_factor >= 0 && std::isfinite(config.capacity_factor),
           "cuda moe_route: capacity_factor = {} must be >= 0 (0: dropless)", config.capacity_factor);
  MoeRouting r{config,
               empty_on(DType::F64, Shape{N, E}, dev, stream),
               empty_on(DType::F64, Shape{N, E}, dev, stream),
               empty_on(DType::F64, Shape{N}, dev, stream),
               empty_on(DType::I64, Shape{N, k}, dev, stream),
               empty_on(DType::F64, Shape{N, k}, dev, stream),
               empty_on(DType::U8, Shape{N, k}, dev, stream),
               empty_on(DType::I64, Shape{E}, dev, stream),
               empty_on(DType::I64, Shape{}, dev, stream),
               empty_on(DType::F32, Shape{}, dev, stream),
               empty_on(DType::F32, Shape{}, dev, stream)};
  const launch::MoeDims m{N, x.shape()[1], E, k};
  check(launch::moe_route(f(x), f(gate), f64(r.logits), f64(r.probs), f64(r.lse), i64(r.expert), f64(r.weight), m,
                          config.normalize, config.sigmoid, stream.handle),
        "moe_route kernel");
  const int64_t capacity =
      config.capacity_factor > 0
          ? static_cast<int64_t>(std::ceil(config.capacity_factor * static_cast<double>(N * k) / static_cast<double>(E)))
          : -1;
  check(launch::moe_capacity(i64(r.expert), static_cast<uint8_t*>(r.kept.device_ptr()), i64(r.expert_tokens),
                             i64(r.dropped), f(r.aux_loss), f(r.z_loss), f64(r.probs), f64(r.lse), capacity, m,
                             stream.handle),
        "moe_route capacity kernel");
  return r;
}

namespace {

// The plan kernel: d.pos, and each expert's rows on the device.
std::pair<MoeDispatch, Tensor> plan_on_device(const MoeRouting& r, Stream stream) {
  const launch::MoeDims m = dims_of(r, 0);
  const Device dev = r.expert.device();
  MoeDispatch d{empty_on(DType::I64, r.expert.shape(), dev, stream), {}, 0};
  Tensor rows = empty_on(DType::I64, Shape{m.experts}, dev, stream);
  check(launch::moe_plan(i64(r.expert), static_cast<const uint8_t*>(r.kept.device_ptr()), i64(d.pos), i64(rows), m,
                         stream.handle),
        "moe_plan kernel");
  return {std::move(d), std::move(rows)};
}

}  // namespace

MoeDispatch moe_plan(const MoeRouting& r, Stream stream) {
  auto [d, rows] = plan_on_device(r, stream);
  const Tensor host = to_host(rows, stream);
  d.expert_rows.assign(host.data<int64_t>(), host.data<int64_t>() + rows.numel());
  for (int64_t n : d.expert_rows) d.rows += n;
  return d;
}

MoeDispatch moe_plan(const MoeRouting& r, std::vector<int64_t> expert_rows, Stream stream) {
  SW_CHECK(static_cast<int64_t>(expert_rows.size()) == r.probs.shape()[1], "cuda moe_plan: {} expert sizes for {} experts",
           expert_rows.size(), r.probs.shape()[1]);
  MoeDispatch d = plan_on_device(r, stream).first;
  d.expert_rows = std::move(expert_rows);
  for (int64_t n : d.expert_rows) d.rows += n;
  return d;
}

Tensor moe_block_sums(const MoeRouting& r, int64_t token_offset, int64_t expert_offset, int64_t local_experts,
                      Stream stream) {
  const launch::MoeDims m = dims_of(r, 0);
  Tensor out = empty_on(DType::F64, Shape{3 + m.top_k * m.experts + m.experts + 1}, r.expert.device(), stream);
  const launch::MoeBlockHead head{static_cast<double>(token_offset), static_cast<double>(expert_offset),
                                  static_cast<double>(local_experts)};
  check(launch::moe_block_sums(i64(r.expert), f64(r.probs), f64(r.lse), head, f64(out), m, stream.handle),
        "moe_block_sums kernel");
  return out;
}

Tensor moe_gather(const Tensor& x, const MoeDispatch& d, Stream stream) {
  need("moe_gather", "x", x, DType::F32, d.pos.device());
  SW_CHECK(x.ndim() == 2 && x.shape()[0] == d.pos.shape()[0], "cuda moe_gather: x {} must be [{}, hidden]",
           x.shape().to_string(), d.pos.shape()[0]);
  const launch::MoeDims m{x.shape()[0], x.shape()[1], 0, d.pos.shape()[1]};
  Tensor rows = empty_on(DType::F32, Shape{d.rows, m.hidden}, x.device(), stream);
  check(launch::moe_gather(f(x), i64(d.pos), f(rows), m, stream.handle), "moe_gather kernel");
  return rows;
}

Tensor moe_combine(const Tensor& y, const MoeDispatch& d, const MoeRouting& r, Stream stream) {
  const int64_t hidden = y.ndim() == 2 ? y.shape()[1] : -1;
  need_rows("moe_combine", "y", y, d.pos.device(), d.rows, hidden);
  const launch::MoeDims m = dims_of(r, hidden);
  Tensor out = empty_on(DType::F32, Shape{m.tokens, hidden}, y.device(), stream);
  check(launch::moe_combine(f(y), i64(d.pos), f64(r.weight), f(out), m, stream.handle), "moe_combine kernel");
  return out;
}

MoeCombineGrad moe_combine_backward(const Tensor& dout, const Tensor& y, const MoeDispatch& d, const MoeRouting& r,
                                    Stream stream) {
  const int64_t hidden = y.ndim() == 2 ? y.shape()[1] : -1;
  const launch::MoeDims m = dims_of(r, hidden);
  need_rows("moe_combine_backward", "y", y, d.pos.device(), d.rows, hidden);
  need_rows("moe_combine_backward", "dout", dout, d.pos.device(), m.tokens, hidden);
  MoeCombineGrad g{empty_on(DType::F32, y.shape(), y.device(), stream),
                   empty_on(DType::F64, r.weight.shape(), y.device(), stream)};
  check(launch::moe_combine_backward(f(dout), f(y), i64(d.pos), f64(r.weight), f(g.dy), f64(g.dweight), m,
                                     stream.handle),
        "moe_combine_backward kernel");
  return g;
}

MoeRouterGradResult moe_router_backward(const Tensor& x, const Tensor& gate, const MoeRouting& r, const MoeDispatch& d,
                                        const Tensor& dx_rows, const Tensor& dweight, const Tensor& daux,
                                        const Tensor& dz, Stream stream) {
  const Device dev = d.pos.device();
  const int64_t hidden = x.ndim() == 2 ? x.shape()[1] : -1;
  const launch::MoeDims m = dims_of(r, hidden);
  need_rows("moe_router_backward", "x", x, dev, m.tokens, hidden);
  need_rows("moe_router_backward", "gate", gate, dev, m.experts, hidden);
  need_rows("moe_router_backward", "dx_rows", dx_rows, dev, d.rows, hidden);
  need("moe_router_backward", "dweight", dweight, DType::F64, dev);
  need_shape("moe_router_backward", "dweight", dweight, r.weight.shape());
  Tensor dx = empty_on(DType::F64, x.shape(), dev, stream), dl = empty_on(DType::F64, r.probs.shape(), dev, stream);
  MoeRouterGradResult g{empty_on(DType::F32, x.shape(), dev, stream), empty_on(DType::F32, gate.shape(), dev, stream)};
  check(launch::moe_gather_backward(f(dx_rows), i64(d.pos), f64(dx), m, stream.handle), "moe_gather_backward kernel");
  const launch::MoeRouterGrad a{f(x), f(gate), f64(r.logits), f64(r.probs), f64(r.lse), i64(r.expert),
                                i64(r.expert_tokens),
                                static_cast<double>(r.tokens_total >= 0 ? r.tokens_total : m.tokens), f64(dweight),
                                scalar_or_null("moe_router_backward", "daux", daux, dev),
                                scalar_or_null("moe_router_backward", "dz", dz, dev), f64(dl), f64(dx), f(g.dgate),
                                f(g.dx)};
  check(launch::moe_router_backward(a, m, r.config.normalize, r.config.sigmoid, stream.handle),
        "moe_router_backward kernel");
  return g;
}

}  // namespace shardwise::cuda
