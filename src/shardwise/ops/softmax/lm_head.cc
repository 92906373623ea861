#include "shardwise/ops/softmax/lm_head.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "shardwise/tensor/gemm.h"

namespace shardwise::ops {

namespace {

constexpr std::string_view kOp = "lm_head_cross_entropy";

// The dtype the chunks compute in: f32 for the half types, else the inputs' own.
DType compute_dtype(DType dtype) { return dtype == DType::F16 || dtype == DType::BF16 ? DType::F32 : dtype; }

const std::byte* row_ptr(const Tensor& t, int64_t row, int64_t width) {
  return t.raw() + row * width * static_cast<int64_t>(dtype_size(t.dtype()));
}
std::byte* row_ptr(Tensor& t, int64_t row, int64_t width) {
  return t.raw() + row * width * static_cast<int64_t>(dtype_size(t.dtype()));
}

// Rows [r0, r0 + rc) of a contiguous tensor whose rows have `width` elements, as a [rc] (width 1)
// or [rc, width] tensor.
Tensor rows_of(const Tensor& t, int64_t r0, int64_t rc, int64_t width, bool keep_width) {
  Tensor out = Tensor::uninitialized(t.dtype(), keep_width ? Shape{rc, width} : Shape{rc});
  if (rc > 0) std::memcpy(out.raw(), row_ptr(t, r0, width), out.nbytes());
  return out;
}

void all_reduce(comm::Communicator* group, std::vector<double>& v, comm::Reduce op) {
  if (group) group->all_reduce(v.data(), v.data(), static_cast<int64_t>(v.size()), DType::F64, op);
}

// Everything both directions share: the inputs in the compute dtype, the row count and chunking.
struct Plan {
  Tensor h, w, labels;  // h as [N, H] in the compute dtype; w [V_local, H]; labels flat [N]
  DType ct = DType::F32;
  int64_t n = 0, hidden = 0, v_local = 0, chunk_rows = 1, count = 0;
};

Plan make_plan(const Tensor& h, const Tensor& w, const Tensor& labels, const LmHeadArgs& args) {
  SW_CHECK(h.defined() && w.defined() && labels.defined(), "{}: h, W or labels is undefined", kOp);
  check_lm_head_args(h.shape(), h.dtype(), w.shape(), w.dtype(), labels.shape(), labels.dtype());
  Plan p;
  p.ct = compute_dtype(h.dtype());
  p.hidden = h.shape().back();
  p.n = labels.numel();
  p.v_local = w.shape()[0];
  p.h = (p.ct == h.dtype() ? h : h.to(p.ct)).reshaped(Shape{p.n, p.hidden});
  p.w = p.ct == w.dtype() ? w : w.to(p.ct);
  p.labels = labels.reshaped(Shape{p.n});
  const int64_t classes = args.shard.classes < 0 ? p.v_local : args.shard.classes;
  SW_CHECK(args.shard.offset >= 0 && args.shard.offset + p.v_local <= classes,
           "{}: the weight block holds classes [{}, {}), outside the {} classes", kOp, args.shard.offset,
           args.shard.offset + p.v_local, classes);
  p.chunk_rows = lm_head_chunk_rows(classes, p.ct, args.chunk_bytes);
  for (int64_t i = 0; i < p.n; ++i) {
    const auto y = static_cast<int64_t>(p.labels.at(i));
    if (y == args.ignore_index) continue;
    SW_CHECK(y >= 0 && y < classes,
             "{}: label {} at position {} is out of range: labels must be in [0, {}) or equal ignore_index ({})", kOp,
             y, i, classes, args.ignore_index);
    ++p.count;
  }
  return p;
}

// The chunk's logits h[r0 : r0 + rc] · Wᵀ, [rc, V_local].
Tensor chunk_logits(const Plan& p, int64_t r0, int64_t rc) {
  Tensor logits = Tensor::uninitialized(p.ct, Shape{rc, p.v_local});
  if (rc == 0 || p.v_local == 0) return logits;
  gemm(p.ct, gemm_args(false, true, rc, p.v_local, p.hidden), row_ptr(p.h, r0, p.hidden), p.w.raw(), logits.raw());
  return logits;
}

// The chunk's global row max and this block's sums given it (max all-reduced over the group).
CrossEntropyRowSums chunk_rows(const Tensor& logits, const Tensor& labels, const LmHeadArgs& args,
                               std::vector<double>& row_max) {
  row_max = cross_entropy_local_max(logits);
  all_reduce(args.group, row_max, comm::Reduce::Max);
  return cross_entropy_local_sums(logits, labels, row_max, args.ignore_index, args.shard);
}

// t (in the compute dtype) in `dtype`: rounded once where they differ.
Tensor in_dtype(const Tensor& t, DType dtype) { return t.defined() && t.dtype() != dtype ? t.to(dtype) : t; }

// A chunk's f32 dlogits rounded to the half type `half` (f16 / bf16 inputs; others: unchanged) and
// held in f32: the operand the gradient GEMMs of a half-type GEMM read (as autocast's matmul
// backward and cuBLASLt's bf16 GEMM read them); products of half values summed in f32 after that.
void round_to_input_dtype(Tensor& dlogits, DType half) {
  if (half != DType::F16 && half != DType::BF16) return;
  float* d = dlogits.data<float>();
  for (int64_t i = 0; i < dlogits.numel(); ++i) {
    d[i] = half == DType::BF16 ? static_cast<float>(bf16(d[i])) : static_cast<float>(f16(d[i]));
  }
}

// v rounded to `dtype` (as a tensor of it would hold it), back in double.
double rounded(DType dtype, double v) { return Tensor::full(dtype, Shape{}, v).at(0); }

// g * factor computed in the compute dtype `ct`, in g's dtype.
Tensor scaled(const Tensor& g, double factor, DType ct) {
  const Tensor x = g.to(ct);
  Tensor y = Tensor::uninitialized(ct, x.shape());
  auto run = [&]<class T>() {
    const T* a = x.data<T>();
    T* b = y.data<T>();
    for (int64_t i = 0; i < x.numel(); ++i) b[i] = static_cast<T>(static_cast<double>(a[i]) * factor);
  };
  if (ct == DType::F64) run.template operator()<double>();
  else run.template operator()<float>();
  return in_dtype(y, g.dtype());
}

// The wanted gradients by recomputing each chunk's logits (dloss checked by the caller).
std::array<Tensor, 2> recomputed_grads(const Tensor& h, const Tensor& w, const Tensor& labels, const Tensor& dloss,
                                       const LmHeadArgs& args, std::array<bool, 2> want_grad) {
  Plan p = make_plan(h, w, labels, args);
  // The chunks see a "sum" (or "none") weight: "mean" divides by the count of every row, not the chunk's.
  Tensor g = dloss.to(p.ct).reshaped(args.reduction == LossReduction::None ? Shape{p.n} : Shape{});
  LossReduction chunk_reduction = args.reduction;
  if (args.reduction == LossReduction::Mean) {
    g.set_at(0, g.at(0) / static_cast<double>(p.count));
    chunk_reduction = LossReduction::Sum;
  }
  Tensor dh = want_grad[0] ? Tensor(p.ct, Shape{p.n, p.hidden}) : Tensor();
  Tensor dw = want_grad[1] ? Tensor(p.ct, p.w.shape()) : Tensor();
  std::vector<double> row_max;
  for (int64_t r0 = 0; r0 < p.n; r0 += p.chunk_rows) {
    const int64_t rc = std::min(p.chunk_rows, p.n - r0);
    Tensor logits = chunk_logits(p, r0, rc), labels_c = rows_of(p.labels, r0, rc, 1, false);
    CrossEntropyRowSums s = chunk_rows(logits, labels_c, args, row_max);
    all_reduce(args.group, s.sum_exp, comm::Reduce::Sum);
    Tensor g_c = chunk_reduction == LossReduction::None ? rows_of(g, r0, rc, 1, false) : g;
    Tensor dlogits = cross_entropy_backward_from_rows(logits, labels_c, g_c, row_max, s.sum_exp, args.ignore_index,
                                                      chunk_reduction, args.shard);
    round_to_input_dtype(dlogits, h.dtype());
    if (p.v_local == 0) continue;  // dh stays 0, dW is empty
    if (want_grad[0]) {
      // dh_c = dlogits · W
      gemm(p.ct, gemm_args(false, false, rc, p.hidden, p.v_local), dlogits.raw(), p.w.raw(), row_ptr(dh, r0, p.hidden));
    }
    if (want_grad[1]) {
      // dW += dlogitsᵀ · h_c
      gemm(p.ct, gemm_args(true, false, p.v_local, p.hidden, rc, 1.0), dlogits.raw(), row_ptr(p.h, r0, p.hidden), dw.raw());
    }
  }
  if (dh.defined()) dh = dh.reshaped(h.shape());
  return {in_dtype(dh, h.dtype()), in_dtype(dw, h.dtype())};
}

}  // namespace

LmHeadArgs lm_head_args(const Attrs& attrs, std::string_view op) {
  LmHeadArgs a;
  a.ignore_index = cross_entropy_ignore_index(attrs);
  a.reduction = loss_reduction(attrs, op);
  a.chunk_bytes = attrs.get_int("chunk_bytes", kLmHeadChunkBytes);
  SW_CHECK(a.chunk_bytes > 0, "{}: attribute chunk_bytes must be > 0 (the byte budget of one chunk's logits), got {}",
           op, a.chunk_bytes);
  const int64_t grads = attrs.get_int("forward_grads", 0);
  SW_CHECK(grads >= 0 && grads <= (kLmHeadGradH | kLmHeadGradW),
           "{}: attribute forward_grads must be 0-3 (bit 1: dh, bit 2: dW computed in the forward), got {}", op, grads);
  a.forward_grads = static_cast<int>(grads);
  SW_CHECK(a.forward_grads == 0 || a.reduction != LossReduction::None,
           "{}: forward_grads needs reduction \"sum\" or \"mean\" (with \"none\" the loss gradient is one "
           "value per row, unknown in the forward)", op);
  a.grad_scale = attrs.get_float("grad_scale", 1.0);
  SW_CHECK(std::isfinite(a.grad_scale) && a.grad_scale != 0.0,
           "{}: attribute grad_scale must be finite and nonzero (the dloss the forward's gradients are formed for), got {}",
           op, a.grad_scale);
  return a;
}

DType lm_head_loss_dtype(DType h_dtype) { return compute_dtype(h_dtype); }

int lm_head_num_outputs(const LmHeadArgs& args) {
  return 1 + ((args.forward_grads & kLmHeadGradH) ? 1 : 0) + ((args.forward_grads & kLmHeadGradW) ? 1 : 0);
}

int64_t lm_head_chunk_rows(int64_t classes, DType dtype, int64_t chunk_bytes) {
  const int64_t row_bytes = std::max<int64_t>(classes, 1) * static_cast<int64_t>(dtype_size(dtype));
  return std::max<int64_t>(chunk_bytes / row_bytes, 1);
}

void check_lm_head_args(const Shape& h, DType h_dtype, const Shape& w, DType w_dtype, const Shape& labels,
                        DType labels_dtype) {
  SW_CHECK(is_floating(h_dtype), "{}: h must have a floating dtype (f32, f64, f16, bf16), got {}", kOp,
           dtype_name(h_dtype));
  SW_CHECK(h.ndim() >= 1, "{}: h must have a hidden dim (shape [..., H]), got a scalar", kOp);
  SW_CHECK(w.ndim() == 2 && w[1] == h.back() && w_dtype == h_dtype,
           "{}: W must be [V, H] of h's dtype with H = {} (h {} {}), got {} {}", kOp, h.back(), h.to_string(),
           dtype_name(h_dtype), w.to_string(), dtype_name(w_dtype));
  SW_CHECK(labels_dtype == DType::I64 || labels_dtype == DType::I32,
           "{}: labels must be i64 or i32 class ids, got {}", kOp, dtype_name(labels_dtype));
  bool ok = labels.ndim() == h.ndim() - 1;
  for (int d = 0; ok && d < labels.ndim(); ++d) ok = labels[d] == h[d];
  SW_CHECK(ok, "{}: labels must have h's shape without the hidden dim: h {} needs labels of shape [{}], got {}", kOp,
           h.to_string(), fmt::join(h.span().first(static_cast<size_t>(h.ndim() - 1)), ","), labels.to_string());
}

std::vector<Tensor> lm_head_cross_entropy_outputs(const Tensor& h, const Tensor& w, const Tensor& labels,
                                                  const LmHeadArgs& args) {
  Plan p = make_plan(h, w, labels, args);
  const bool gh = (args.forward_grads & kLmHeadGradH) != 0, gw = (args.forward_grads & kLmHeadGradW) != 0;
  // The dlogits weight: cross_entropy_backward_from_rows' for dloss = grad_scale (rounded as the
  // backward would see it: to the loss's dtype, the compute dtype, and / count in it for "mean").
  double weight = rounded(p.ct, args.grad_scale);
  if (args.reduction == LossReduction::Mean) weight = rounded(p.ct, weight / static_cast<double>(p.count));
  const bool no_classes = p.v_local == 0;  // nothing to multiply: dh is 0, dW is empty
  Tensor dh = gh ? (no_classes ? Tensor(p.ct, Shape{p.n, p.hidden}) : Tensor::uninitialized(p.ct, Shape{p.n, p.hidden}))
                 : Tensor();
  Tensor dw = gw ? Tensor::uninitialized(p.ct, p.w.shape()) : Tensor();
  bool dw_written = false;
  std::vector<double> row_max(static_cast<size_t>(p.n)), chunk_max;
  std::vector<uint8_t> exp_rows;
  CrossEntropyRowSums all{std::vector<double>(static_cast<size_t>(p.n)), std::vector<double>(static_cast<size_t>(p.n))};
  for (int64_t r0 = 0; r0 < p.n; r0 += p.chunk_rows) {
    const int64_t rc = std::min(p.chunk_rows, p.n - r0);
    Tensor logits = chunk_logits(p, r0, rc), labels_c = rows_of(p.labels, r0, rc, 1, false);
    chunk_max = cross_entropy_local_max(logits);
    all_reduce(args.group, chunk_max, comm::Reduce::Max);
    CrossEntropyRowSums s = gh || gw ? cross_entropy_local_sums_to_exp(logits, labels_c, chunk_max, args.ignore_index,
                                                                       args.shard, exp_rows)
                                     : cross_entropy_local_sums(logits, labels_c, chunk_max, args.ignore_index, args.shard);
    // sum_exp and the target logit (0 on the ranks without the label) in one all-reduce.
    std::vector<double> buf(s.sum_exp);
    buf.insert(buf.end(), s.target.begin(), s.target.end());
    all_reduce(args.group, buf, comm::Reduce::Sum);
    const auto at = static_cast<std::ptrdiff_t>(r0), k = static_cast<std::ptrdiff_t>(rc);
    std::copy_n(chunk_max.begin(), k, row_max.begin() + at);
    std::copy_n(buf.begin(), k, all.sum_exp.begin() + at);
    std::copy_n(buf.begin() + k, k, all.target.begin() + at);
    if ((!gh && !gw) || no_classes) continue;
    // The chunk's dlogits in the logits' buffer, then its share of both gradients.
    cross_entropy_grad_in_place(logits, labels_c, weight, chunk_max, std::span<const double>(buf.data(), buf.size() / 2),
                                exp_rows, args.ignore_index, args.shard);
    round_to_input_dtype(logits, h.dtype());
    if (gh) {  // dh_c = dlogits · W
      gemm(p.ct, gemm_args(false, false, rc, p.hidden, p.v_local), logits.raw(), p.w.raw(), row_ptr(dh, r0, p.hidden));
    }
    if (gw) {  // dW += dlogitsᵀ · h_c (the first chunk writes it)
      gemm(p.ct, gemm_args(true, false, p.v_local, p.hidden, rc, dw_written ? 1.0 : 0.0), logits.raw(),
           row_ptr(p.h, r0, p.hidden), dw.raw());
      dw_written = true;
    }
  }
  if (gw && !dw_written) dw = Tensor(p.ct, p.w.shape());  // no rows: dW is 0
  std::vector<Tensor> out{cross_entropy_from_rows(labels, p.ct, row_max, all, args.ignore_index, args.reduction)};
  if (gh) out.push_back(in_dtype(dh, h.dtype()).reshaped(h.shape()));
  if (gw) out.push_back(in_dtype(dw, h.dtype()));
  return out;
}

Tensor lm_head_cross_entropy(const Tensor& h, const Tensor& w, const Tensor& labels, const LmHeadArgs& args) {
  LmHeadArgs loss_only = args;
  loss_only.forward_grads = 0;
  return lm_head_cross_entropy_outputs(h, w, labels, loss_only)[0];
}

std::array<Tensor, 2> lm_head_cross_entropy_backward(const Tensor& h, const Tensor& w, const Tensor& labels,
                                                     const Tensor& dloss, const LmHeadArgs& args,
                                                     std::array<bool, 2> want_grad, const std::array<Tensor, 2>& saved) {
  SW_CHECK(h.defined() && labels.defined(), "{} backward: h or labels is undefined", kOp);
  const Shape want = cross_entropy_loss_shape(labels.shape(), args.reduction);
  const DType loss_dtype = lm_head_loss_dtype(h.dtype());
  SW_CHECK(dloss.defined() && dloss.shape() == want && dloss.dtype() == loss_dtype,
           "{} backward: dloss must be {} {} (the loss's dtype), got {} {}", kOp, dtype_name(loss_dtype), want.to_string(),
           dloss.defined() ? dtype_name(dloss.dtype()) : "undefined", dloss.shape().to_string());
  std::array<Tensor, 2> out;
  std::array<bool, 2> recompute{};
  for (size_t k = 0; k < 2; ++k) {
    recompute[k] = want_grad[k] && !saved[k].defined();
    if (!want_grad[k] || recompute[k]) continue;
    // The forward formed it for dloss = grad_scale: as it is when that is the dloss here.
    const DType ct = compute_dtype(h.dtype());
    const double g = dloss.to(ct).at(0), formed = rounded(ct, args.grad_scale);
    out[k] = g == formed ? saved[k] : scaled(saved[k], g / formed, ct);
  }
  if (recompute[0] || recompute[1]) {
    std::array<Tensor, 2> r = recomputed_grads(h, w, labels, dloss, args, recompute);
    for (size_t k = 0; k < 2; ++k) {
      if (recompute[k]) out[k] = r[k];
    }
  }
  return out;
}

}  // namespace shardwise::ops
