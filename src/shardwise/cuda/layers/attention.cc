#include "shardwise/cuda/layers/attention.h"

#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "shardwise/cuda/memory/cuda_memory.h"
#include "shardwise/cuda/common/kernel_args.h"
#include "shardwise/cuda/common/launchers.h"
#include "shardwise/cuda/layers/attention_mma_plan.h"
#include "shardwise/tensor/device_copy.h"

namespace shardwise::cuda {

using namespace detail;  // kernel_args.h

namespace {

// Error naming the kernel unless q, k, v (and doc) have the layouts of attention.h on one device.
launch::AttentionShape check_inputs(std::string_view kernel, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& doc, double scale) {
  const Device dev = q.device();
  SW_CHECK(q.defined() && (q.dtype() == DType::F32 || q.dtype() == DType::BF16),
           "cuda {}: q must be f32 or bf16, got {}", kernel, q.defined() ? dtype_name(q.dtype()) : "undefined");
  need(kernel, "q", q, q.dtype(), dev);
  need(kernel, "k", k, q.dtype(), dev);
  need(kernel, "v", v, q.dtype(), dev);
  SW_CHECK(q.ndim() == 4 || q.ndim() == 5, "cuda {}: q must be [B, H, S, D] or grouped [B, G, R, S, D], got {}",
           kernel, q.shape().to_string());
  const Shape& s = q.shape();
  const bool grouped = q.ndim() == 5;
  const launch::AttentionShape a{s[0], s[1], grouped ? s[2] : 1, s[s.size() - 2], s.back(), static_cast<float>(scale)};
  need_shape(kernel, "k", k, Shape{a.batch, a.groups, a.seq, a.head_dim});
  need_shape(kernel, "v", v, k.shape());
  SW_CHECK(a.head_dim <= 128, "cuda {}: head dim {} is over the kernel's 128", kernel, a.head_dim);
  SW_CHECK(scale > 0 && std::isfinite(scale), "cuda {}: scale must be a positive number, got {}", kernel, scale);
  if (doc.defined()) {
    need(kernel, "doc", doc, DType::I64, dev);
    need_shape(kernel, "doc", doc, Shape{a.batch, a.seq});
  }
  return a;
}

// The path asked for, an Error naming why when TensorCore does not apply.
launch::AttentionShape with_path(std::string_view kernel, launch::AttentionShape a, AttentionPath path,
                                 std::initializer_list<const Tensor*> tensors) {
  if (path == AttentionPath::TensorCore) {
    bool aligned = true;
    for (const Tensor* t : tensors) aligned = aligned && reinterpret_cast<uintptr_t>(t->device_ptr()) % 16 == 0;
    SW_CHECK(tensors.begin()[0]->dtype() == DType::BF16 && mma_plan::supported_head_dim(a.head_dim) && aligned,
             "cuda {}: the tensor-core kernel takes bf16 with head dim 64 or 128 and 16-byte aligned tensors; got {} "
             "with head dim {}{}",
             kernel, dtype_name(tensors.begin()[0]->dtype()), a.head_dim, aligned ? "" : ", a tensor not 16-byte aligned");
  }
  a.path = path;
  return a;
}

launch::Elem elem_of(const Tensor& q) { return q.dtype() == DType::F32 ? launch::Elem::F32 : launch::Elem::BF16; }
const int64_t* doc_of(const Tensor& doc) {
  return doc.defined() ? static_cast<const int64_t*>(doc.device_ptr()) : nullptr;
}
Shape lse_shape(const Shape& q) { return Shape(q.span().first(q.size() - 1)); }

}  // namespace

AttentionResult flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc, double scale,
                                Stream stream, AttentionPath path) {
  launch::AttentionShape a = check_inputs("flash_attention", q, k, v, doc, scale);
  AttentionResult r{empty_on(q.dtype(), q.shape(), q.device(), stream),
                    empty_on(DType::F32, lse_shape(q.shape()), q.device(), stream)};
  a = with_path("flash_attention", a, path, {&q, &k, &v, &r.out});
  check(launch::attention_forward(elem_of(q), q.device_ptr(), k.device_ptr(), v.device_ptr(), doc_of(doc),
                                  r.out.device_ptr(), f(r.lse), a, stream.handle),
        "flash_attention kernel");
  return r;
}

AttentionGradResult flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc,
                                             const Tensor& out, const Tensor& lse, const Tensor& dout, double scale,
                                             Stream stream, AttentionPath path) {
  launch::AttentionShape a = check_inputs("flash_attention_backward", q, k, v, doc, scale);
  need("flash_attention_backward", "out", out, q.dtype(), q.device());
  need_shape("flash_attention_backward", "out", out, q.shape());
  need("flash_attention_backward", "dout", dout, q.dtype(), q.device());
  need_shape("flash_attention_backward", "dout", dout, q.shape());
  need_f32("flash_attention_backward", "lse", lse, q.device(), lse_shape(q.shape()));
  AttentionGradResult g{empty_on(q.dtype(), q.shape(), q.device(), stream),
                        empty_on(q.dtype(), k.shape(), q.device(), stream),
                        empty_on(q.dtype(), v.shape(), q.device(), stream)};
  Tensor delta = empty_on(DType::F32, lse.shape(), q.device(), stream);
  a = with_path("flash_attention_backward", a, path, {&q, &k, &v, &dout, &g.dq, &g.dk, &g.dv});
  check(launch::attention_backward(elem_of(q), q.device_ptr(), k.device_ptr(), v.device_ptr(), doc_of(doc),
                                   out.device_ptr(), f(lse), dout.device_ptr(), f(delta), g.dq.device_ptr(),
                                   g.dk.device_ptr(), g.dv.device_ptr(), a, stream.handle),
        "flash_attention_backward kernel");
  return g;
}

}  // namespace shardwise::cuda
