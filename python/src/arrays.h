#pragma once
// Tensors to and from Python arrays without copies: anything that speaks DLPack or the buffer
// protocol (NumPy, PyTorch) comes in as a shardwise::Tensor over the caller's memory, and a Tensor
// goes out as a NumPy array (bf16: a DLPack-capable array) over the Tensor's storage; a device
// tensor goes out as a DLPack array on its device. Arrays on a CUDA device (kDLCUDA,
// kDLCUDAManaged) become device tensors (Device::cuda(ordinal)) only through tensor_on_device;
// pinned host memory (kDLCUDAHost) is host memory. Nothing here dereferences device memory.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "shardwise/tensor/tensor.h"

namespace shardwise::py {

namespace nb = nanobind;
using AnyArray = nb::ndarray<>;  // on any device: the converters below check it

// The shardwise dtype of an array; Error naming the array's dtype when shardwise has none.
DType dtype_of(const AnyArray& array, std::string_view what);

// A host Tensor over the array's memory (no copy); it keeps the array's owner alive. Error, naming
// `what`, for a non-contiguous array (pass np.ascontiguousarray(x) to copy it explicitly), and for
// an array on a device, naming `api` (a host-only API: run_op's CPU kernels, checkpoint.save, ...).
Tensor tensor_from(const AnyArray& array, std::string_view what, std::string_view api);

// A Tensor over the array's memory wherever it lives (no copy): a device tensor for an array on a
// CUDA device, when shardwise has that device's memory (a CUDA build registers the GPUs the first
// time one is asked for; tests register a fake device). Otherwise an Error naming the device and
// saying how to go on (x.cpu()).
Tensor tensor_on_device(const AnyArray& array, std::string_view what);

// The device an array lives on, as shardwise names it ("host", "cuda:0"; other DLPack devices by
// their DLPack number: "dlpack device 4:0").
std::string device_name(const AnyArray& array);

// An array over the tensor's storage (no copy); the storage lives as long as the array does. A
// device tensor's array is on its device (__dlpack_device__ says so).
nb::object array_from(const Tensor& tensor);

// Whether this package was built with the CUDA layer, and (once per process, where it was) the
// registration of every GPU's device memory (devices.cc).
bool cuda_built();
void register_cuda_devices();

// run_op with an input on a device: the op's CUDA kernel where one is bound (gelu, silu, in a CUDA
// build), its outputs on the device; otherwise an Error naming the op, the input and its device.
nb::object run_device_op(const std::string& op, const std::vector<AnyArray>& inputs);

}  // namespace shardwise::py
