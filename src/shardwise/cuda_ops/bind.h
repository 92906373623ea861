#pragma once
// The CUDA kernels (src/shardwise/cuda/layers/kernels.h) bound to the ops they compute: the device kernel
// table of DeviceKind::Cuda (ops/device_kernels.h). A layer of its own above ops and cuda (the ops
// layer knows nothing of CUDA), built only where CUDA is. An op without a binding here fails on CUDA
// tensors naming itself; tests/cuda/test_cuda_coverage.cc lists which ops of a training step are
// still without one. Compiled only: no binding has run on a GPU (docs/gpu.md).
#include <memory>

#include "shardwise/ops/device_kernels.h"

namespace shardwise::cuda_ops {

// The table (name "cuda"): GELU and SiLU, layer_norm, rms_norm and cross_entropy (bind.cc) and the
// op families of families.h, forward and gradient; the fill of any value. Built once.
std::shared_ptr<const ops::DeviceKernelTable> cuda_kernel_table();
// install_device_kernels(DeviceKind::Cuda, cuda_kernel_table()).
void install_cuda_kernels();

}  // namespace shardwise::cuda_ops
