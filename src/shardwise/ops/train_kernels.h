#pragma once
// The optimizer's elementwise kernels (AdamW, the gradient norm's sums of squares, scaling, the
// gradient sums over micro-batches), which are no ops of a graph: their CPU kernels on host memory
// (train/optimizer.h and the pipeline runner call these), and the same work on device tensors
// through the device's kernel table (device_kernels.h: DeviceTrainKernels). The fake device's table
// runs the CPU kernels on its memory, so a trainer on the fake device computes the CPU's bits.
#include <cstdint>
#include <functional>
#include <span>

#include "shardwise/tensor/tensor.h"

namespace shardwise::ops {

// One AdamW update's numbers: the configuration, the learning rate and the step (from 1).
struct AdamWHyper {
  double beta1 = 0.9, beta2 = 0.95, epsilon = 1e-8, weight_decay = 0.1, lr = 1e-3;
  int64_t step = 1;
  bool decay = true;  // weight decay on this parameter (matrices)
};

// The CPU kernels. AdamW on `n` elements in place: master `w`, moments `m`, `v`, gradient `g`.
void adamw_update(float* w, float* m, float* v, const float* g, int64_t n, const AdamWHyper& h);
// The squares of g's elements summed in double over fixed blocks of 2^16 elements, the blocks' sums
// added in block order: the same bits on any thread count.
double sum_of_squares(const float* g, int64_t n);
// p[j] *= s for j < n.
void scale_in_place(float* p, int64_t n, float s);

// The same on device tensors (one device), through the kernel table of its kind: an Error naming the
// kernel and the device where the table has none.
// AdamW in place on f32 `master`, `exp_avg`, `exp_avg_sq` with f32 `grad`; `bf16_param` (optional)
// gets the updated master rounded to bf16, in place.
void adamw_on_device(Tensor& master, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad, const AdamWHyper& h,
                     Tensor* bf16_param = nullptr);
// A device tensor [grads.size()] (f64 on the fake device; f32 sums on CUDA): each gradient's sum of
// squares, for the host to read in one copy.
Tensor squares_on_device(std::span<const Tensor> grads);
// t *= s elementwise (f32); t may become a new tensor.
void scale_on_device(Tensor& t, float s);
// sum += g in f32 (g f32 or bf16); an undefined sum becomes an f32 copy of g.
void accumulate_on_device(Tensor& sum, const Tensor& g);

// A device kind's optimizer kernels (DeviceKernelTable::set_train_kernels), each as above.
struct DeviceTrainKernels {
  std::function<void(Tensor& master, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad, const AdamWHyper& h,
                     Tensor* bf16_param)>
      adamw;
  std::function<Tensor(std::span<const Tensor> grads)> squares;
  std::function<void(Tensor& t, float s)> scale;
  std::function<void(Tensor& sum, const Tensor& g)> accumulate;
};

}  // namespace shardwise::ops
