#include <cstdint>

#include "shardwise/cuda/memory/cuda_memory.h"
#include "shardwise/cuda/common/kernel_args.h"
#include "shardwise/cuda/layers/kernels.h"
#include "shardwise/tensor/device_copy.h"

namespace shardwise::cuda {

using namespace detail;  // kernel_args.h

namespace {

const int64_t* labels_of(const Tensor& labels) { return static_cast<const int64_t*>(labels.device_ptr()); }

Rows check_args(std::string_view kernel, const Tensor& logits, const Tensor& labels) {
  const Rows r = rows_of(kernel, logits, "logits");
  need(kernel, "labels", labels, DType::I64, logits.device());
  need_shape(kernel, "labels", labels, r.leading);
  return r;
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index, Reduction reduction,
                     Stream stream) {
  const Rows r = check_args("cross_entropy", logits, labels);
  const Device d = logits.device();
  Tensor loss = empty_on(DType::F32, r.leading, d, stream);
  Tensor bad = zeros_on(DType::I64, Shape{1}, d, stream);
  check(launch::cross_entropy_rows(f(logits), labels_of(labels), f(loss), r.rows, r.cols, ignore_index,
                                   static_cast<int64_t*>(bad.device_ptr()), stream.handle),
        "cross_entropy kernel");
  const int64_t bad_row = to_host(bad, stream).data<int64_t>()[0] - 1;
  if (bad_row >= 0) {
    const int64_t label = to_host(labels, stream).data<int64_t>()[bad_row];
    fail("cuda cross_entropy: label {} of row {} is outside [0, {}) and is not ignore_index {}", label, bad_row, r.cols,
         ignore_index);
  }
  if (reduction == Reduction::None) return loss;
  Tensor out = empty_on(DType::F32, Shape{}, d, stream);
  Tensor count = empty_on(DType::F64, Shape{}, d, stream);
  check(launch::cross_entropy_reduce(f(loss), labels_of(labels), f(out), static_cast<double*>(count.device_ptr()),
                                     r.rows, ignore_index, reduction, stream.handle),
        "cross_entropy reduce kernel");
  return out;
}

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& dloss, int64_t ignore_index,
                              Reduction reduction, Stream stream) {
  const Rows r = check_args("cross_entropy_backward", logits, labels);
  const Device d = logits.device();
  need_f32("cross_entropy_backward", "dloss", dloss, d, reduction == Reduction::None ? r.leading : Shape{});
  Tensor count = empty_on(DType::F64, Shape{}, d, stream);
  if (reduction == Reduction::Mean) {  // the count of non-ignored rows, on the device
    Tensor rows_loss = zeros_on(DType::F32, r.leading, d, stream);
    Tensor unused = empty_on(DType::F32, Shape{}, d, stream);
    check(launch::cross_entropy_reduce(f(rows_loss), labels_of(labels), f(unused),
                                       static_cast<double*>(count.device_ptr()), r.rows, ignore_index, reduction,
                                       stream.handle),
          "cross_entropy count kernel");
  }
  Tensor dlogits = empty_on(DType::F32, logits.shape(), d, stream);
  check(launch::cross_entropy_backward(f(logits), labels_of(labels), f(dloss), static_cast<double*>(count.device_ptr()),
                                       f(dlogits), r.rows, r.cols, ignore_index, reduction, stream.handle),
        "cross_entropy_backward kernel");
  return dlogits;
}

}  // namespace shardwise::cuda
