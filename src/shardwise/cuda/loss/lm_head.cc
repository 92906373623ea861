#include "shardwise/cuda/loss/lm_head.h"

#include <algorithm>

#include "shardwise/cuda/gemm/blas.h"
#include "shardwise/cuda/memory/cuda_memory.h"
#include "shardwise/cuda/tensor_ops/elementwise.h"
#include "shardwise/cuda/common/kernel_args.h"
#include "shardwise/cuda/loss/lm_head_launchers.h"
#include "shardwise/tensor/device_copy.h"

namespace shardwise::cuda {

using namespace detail;  // kernel_args.h

namespace {

const int64_t* ids(const Tensor& labels) { return static_cast<const int64_t*>(labels.device_ptr()); }
double* f64(Tensor& t) { return static_cast<double*>(t.device_ptr()); }
const double* f64(const Tensor& t) { return static_cast<const double*>(t.device_ptr()); }

struct Args {
  Rows rows;
  int64_t vocab, hidden, classes;
};

Args check_args(const Tensor& h, const Tensor& w, const Tensor& labels, const LmHeadOptions& o) {
  SW_CHECK(h.defined() && h.on_device() && (h.dtype() == DType::F32 || h.dtype() == DType::BF16) && h.ndim() >= 1,
           "cuda lm_head: h must be an f32 or bf16 device tensor of rank >= 1, got {}",
           h.defined() ? h.to_string(0) : "an undefined tensor");
  const Shape leading(h.shape().span().first(h.shape().size() - 1));
  const Rows r{leading.numel(), h.shape().back(), leading};
  need("lm_head", "w", w, h.dtype(), h.device());
  SW_CHECK(w.ndim() == 2 && w.shape()[1] == r.cols, "cuda lm_head: w must be [V, {}], got {}", r.cols,
           w.shape().to_string());
  need("lm_head", "labels", labels, DType::I64, h.device());
  need_shape("lm_head", "labels", labels, leading);
  SW_CHECK(!o.grads || o.reduction != launch::Reduction::None,
           "cuda lm_head: gradients in the forward need reduction sum or mean (with none the loss gradient is not "
           "one number)");
  SW_CHECK(o.chunk_bytes > 0, "cuda lm_head: chunk_bytes must be > 0, got {}", o.chunk_bytes);
  const int64_t classes = o.classes < 0 ? w.shape()[0] : o.classes;
  SW_CHECK(o.offset >= 0 && o.offset + w.shape()[0] <= classes, "cuda lm_head: w's rows [{}, {}) lie outside the {} classes",
           o.offset, o.offset + w.shape()[0], classes);
  return {r, w.shape()[0], r.cols, classes};
}

// The count of non-ignored labels (f64 scalar, on the device).
Tensor label_count(const Tensor& labels, int64_t rows, int64_t ignore_index, Stream stream) {
  const Device d = labels.device();
  Tensor zero_loss = zeros_on(DType::F32, Shape{rows}, d, stream), unused = empty_on(DType::F32, Shape{}, d, stream);
  Tensor count = empty_on(DType::F64, Shape{}, d, stream);
  check(launch::cross_entropy_reduce(f(zero_loss), ids(labels), f(unused), f64(count), rows, ignore_index,
                                     launch::Reduction::Mean, stream.handle),
        "lm_head count kernel");
  return count;
}

// A GEMM with `in` operands (f32, or bf16: f32 compute) writing f32.
GemmSpec spec(DType in, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float beta, bool tf32) {
  return {.in = in, .out = DType::F32, .trans_a = ta, .trans_b = tb, .m = m, .n = n, .k = k, .beta = beta,
          .tf32 = tf32 && in == DType::F32};
}

// Element `i` of a row-major f32 or bf16 device tensor.
const void* at(const Tensor& t, int64_t i) {
  return static_cast<const std::byte*>(t.device_ptr()) + i * static_cast<int64_t>(dtype_size(t.dtype()));
}

}  // namespace

LmHeadResult lm_head_cross_entropy(const Tensor& h, const Tensor& w, const Tensor& labels, const LmHeadOptions& o,
                                   Stream stream) {
  const Args a = check_args(h, w, labels, o);
  const Device d = h.device();
  // bf16 h and W stay bf16: the three GEMMs read bf16 operands (the chunk's dlogits rounded to bf16
  // first) and write f32, as the CPU op's f32 GEMMs on the widened values.
  const DType in = h.dtype();
  const bool half = in != DType::F32;
  const int64_t rows = a.rows.rows, V = a.vocab, H = a.hidden;
  // As ops::lm_head_chunk_rows: the budget over the global vocabulary's rows of f32 logits (the CPU
  // op's compute dtype for f32 and bf16 h alike), so both run the same chunks.
  const auto elem = static_cast<int64_t>(sizeof(float));
  const int64_t chunk = std::max<int64_t>(1, o.chunk_bytes / (std::max<int64_t>(a.classes, 1) * elem));
  Tensor loss_rows = zeros_on(DType::F32, Shape{rows}, d, stream);
  Tensor count = label_count(labels, rows, o.ignore_index, stream);
  LmHeadResult out;
  if (o.grads) {
    out.dh = zeros_on(DType::F32, h.shape(), d, stream);
    out.dw = zeros_on(DType::F32, w.shape(), d, stream);
  }
  const int64_t buffer_rows = std::min(chunk, std::max<int64_t>(rows, 1));
  Tensor logits = empty_on(DType::F32, Shape{buffer_rows, V}, d, stream);
  Tensor dlogits = half && o.grads ? empty_on(in, Shape{buffer_rows, V}, d, stream) : logits;
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t rc = std::min(chunk, rows - r0);
    const void* hc = at(h, r0 * H);
    const int64_t* lc = ids(labels) + r0;
    gemm(d, stream, spec(in, false, true, rc, V, H, 0.0f, o.tf32), hc, w.device_ptr(), f(logits));
    Tensor mx = empty_on(DType::F64, Shape{rc}, d, stream);
    check(launch::lm_head_row_max(f(logits), f64(mx), rc, V, stream.handle), "lm_head row max kernel");
    if (o.combine) o.combine(mx, true);
    Tensor sums = empty_on(DType::F64, Shape{2, rc}, d, stream);
    check(launch::lm_head_row_sums(f(logits), lc, f64(mx), f64(sums), f64(sums) + rc, rc, V, o.offset, o.ignore_index,
                                   stream.handle),
          "lm_head row sums kernel");
    if (o.combine) o.combine(sums, false);
    check(launch::lm_head_row_finish(f(logits), lc, f64(mx), f64(sums), f64(sums) + rc, f(loss_rows) + r0, rc, V,
                                     o.offset, o.ignore_index, o.grads, o.grad_scale,
                                     o.reduction == launch::Reduction::Mean, f64(count), stream.handle),
          "lm_head row finish kernel");
    if (!o.grads) continue;
    if (half) {
      check(launch::cast(launch::Elem::F32, launch::Elem::BF16, logits.device_ptr(), dlogits.device_ptr(), rc * V,
                         stream.handle),
            "lm_head dlogits cast kernel");
    }
    gemm(d, stream, spec(in, false, false, rc, H, V, 0.0f, o.tf32), dlogits.device_ptr(), w.device_ptr(),
         f(out.dh) + r0 * H);
    gemm(d, stream, spec(in, true, false, V, H, rc, r0 == 0 ? 0.0f : 1.0f, o.tf32), dlogits.device_ptr(), hc,
         f(out.dw));
  }
  if (o.reduction == launch::Reduction::None) {
    out.loss = loss_rows.reshaped(a.rows.leading);
  } else {
    out.loss = empty_on(DType::F32, Shape{}, d, stream);
    check(launch::cross_entropy_reduce(f(loss_rows), ids(labels), f(out.loss), f64(count), rows, o.ignore_index,
                                       o.reduction, stream.handle),
          "lm_head reduce kernel");
  }
  if (half && o.grads) {  // the loss stays f32 (ops::lm_head_loss_dtype)
    out.dh = cast(out.dh, in, stream);
    out.dw = cast(out.dw, in, stream);
  }
  return out;
}

Tensor vocab_row_max(const Tensor& logits, Stream stream) {
  const Rows r = rows_of("vocab_row_max", logits, "logits");
  Tensor mx = empty_on(DType::F64, r.leading, logits.device(), stream);
  check(launch::lm_head_row_max(f(logits), f64(mx), r.rows, r.cols, stream.handle), "vocab_row_max kernel");
  return mx;
}

VocabRowSums vocab_row_sums(const Tensor& logits, const Tensor& labels, const Tensor& row_max, int64_t offset,
                            int64_t ignore_index, Stream stream) {
  const Rows r = rows_of("vocab_row_sums", logits, "logits");
  need("vocab_row_sums", "labels", labels, DType::I64, logits.device());
  need_shape("vocab_row_sums", "labels", labels, r.leading);
  need("vocab_row_sums", "row_max", row_max, DType::F64, logits.device());
  need_shape("vocab_row_sums", "row_max", row_max, r.leading);
  VocabRowSums s{empty_on(DType::F64, r.leading, logits.device(), stream),
                 empty_on(DType::F64, r.leading, logits.device(), stream)};
  check(launch::lm_head_row_sums(f(logits), ids(labels), f64(row_max), f64(s.sum_exp), f64(s.target), r.rows, r.cols,
                                 offset, ignore_index, stream.handle),
        "vocab_row_sums kernel");
  return s;
}

}  // namespace shardwise::cuda
