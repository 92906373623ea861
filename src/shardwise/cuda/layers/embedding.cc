#include <limits>

#include "shardwise/cuda/memory/cuda_memory.h"
#include "shardwise/cuda/common/kernel_args.h"
#include "shardwise/cuda/layers/kernels.h"
#include "shardwise/tensor/device_copy.h"

namespace shardwise::cuda {

using namespace detail;  // kernel_args.h

namespace {

bool ids_i32(const Tensor& ids) { return ids.dtype() == DType::I32; }

// ids (i64 or i32 on `device`) and the block [offset, offset + rows) of a vocab of vocab_size;
// then every id in [0, vocab_size) (one flag read back: a synchronisation of `stream`). Errors name
// the kernel, and the first bad id with its position.
void check_ids(std::string_view kernel, const Tensor& ids, Device device, int64_t offset, int64_t rows,
               int64_t vocab_size, Stream stream) {
  SW_CHECK(ids.defined() && (ids.dtype() == DType::I64 || ids.dtype() == DType::I32),
           "cuda {}: ids must be i64 or i32", kernel);
  need(kernel, "ids", ids, ids.dtype(), device);
  SW_CHECK(ids.numel() <= std::numeric_limits<int32_t>::max(), "cuda {}: {} ids, over the kernel's 2^31 - 1", kernel,
           ids.numel());
  SW_CHECK(offset >= 0 && rows >= 0 && offset + rows <= vocab_size,
           "cuda {}: the weight block [{}, {}) does not fit a vocab of {} rows", kernel, offset, offset + rows,
           vocab_size);
  Tensor bad = zeros_on(DType::I64, Shape{1}, device, stream);
  check(launch::embedding_check_ids(ids.device_ptr(), ids_i32(ids), ids.numel(), vocab_size,
                                    static_cast<int64_t*>(bad.device_ptr()), stream.handle),
        "embedding id check kernel");
  const int64_t flag = to_host(bad, stream).data<int64_t>()[0];
  if (flag == 0) return;
  const int64_t at = ids.numel() - flag;
  const Tensor host = to_host(ids, stream);
  const int64_t id = ids_i32(ids) ? host.data<int32_t>()[at] : host.data<int64_t>()[at];
  fail("cuda {}: id {} at position {} is out of range for a vocab of {} rows (allowed 0..{})", kernel, id, at,
       vocab_size, vocab_size - 1);
}

Shape out_shape(const Tensor& ids, int64_t hidden) {
  Shape s = ids.shape();
  s.push_back(hidden);
  return s;
}

}  // namespace

Tensor embedding(const Tensor& ids, const Tensor& weight, int64_t vocab_offset, int64_t vocab_size, Stream stream) {
  SW_CHECK(weight.defined() && (weight.dtype() == DType::F32 || weight.dtype() == DType::BF16) && weight.ndim() == 2,
           "cuda embedding: weight must be an f32 or bf16 [vocab, hidden], got {}",
           weight.defined() ? weight.to_string(0) : std::string("an undefined tensor"));
  need("embedding", "weight", weight, weight.dtype(), weight.device());
  const launch::EmbeddingShape e{weight.shape()[0], weight.shape()[1], vocab_offset};
  check_ids("embedding", ids, weight.device(), vocab_offset, e.rows, vocab_size, stream);
  Tensor out = empty_on(weight.dtype(), out_shape(ids, e.hidden), weight.device(), stream);
  const launch::Elem el = weight.dtype() == DType::F32 ? launch::Elem::F32 : launch::Elem::BF16;
  check(launch::embedding_forward(el, ids.device_ptr(), ids_i32(ids), ids.numel(), weight.device_ptr(),
                                  out.device_ptr(), e, stream.handle),
        "embedding kernel");
  return out;
}

Tensor embedding_backward(const Tensor& ids, const Tensor& dout, const Shape& weight_shape, int64_t vocab_offset,
                          int64_t vocab_size, Stream stream) {
  SW_CHECK(weight_shape.ndim() == 2, "cuda embedding_backward: weight must be 2-D [vocab, hidden], got {}",
           weight_shape.to_string());
  const launch::EmbeddingShape e{weight_shape[0], weight_shape[1], vocab_offset};
  SW_CHECK(dout.defined() && (dout.dtype() == DType::F32 || dout.dtype() == DType::BF16),
           "cuda embedding_backward: dout must be f32 or bf16, got {}",
           dout.defined() ? dout.to_string(0) : std::string("an undefined tensor"));
  need("embedding_backward", "dout", dout, dout.dtype(), dout.device());
  need_shape("embedding_backward", "dout", dout, out_shape(ids, e.hidden));
  check_ids("embedding_backward", ids, dout.device(), vocab_offset, e.rows, vocab_size, stream);
  Tensor dw = empty_on(dout.dtype(), weight_shape, dout.device(), stream);
  const launch::Elem el = dout.dtype() == DType::F32 ? launch::Elem::F32 : launch::Elem::BF16;
  const int64_t n = ids.numel();
  Tensor scratch = empty_on(DType::U8, Shape{static_cast<int64_t>(launch::embedding_backward_scratch_bytes(n, vocab_size))},
                            dout.device(), stream);
  check(launch::embedding_backward(el, ids.device_ptr(), ids_i32(ids), n, dout.device_ptr(), dw.device_ptr(), e, vocab_size,
                                   scratch.device_ptr(), stream.handle),
        "embedding_backward kernel");
  return dw;
}

}  // namespace shardwise::cuda
