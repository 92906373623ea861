#pragma once
// Tensors to and from Python arrays without copies: anything that speaks DLPack or the buffer
// protocol (NumPy, PyTorch on the CPU) comes in as a shardwise::Tensor over the caller's memory,
// and a Tensor goes out as a NumPy array (bf16: a DLPack-capable array) over the Tensor's storage.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "shardwise/tensor/tensor.h"

namespace shardwise::py {

namespace nb = nanobind;
using AnyArray = nb::ndarray<nb::device::cpu>;

// The shardwise dtype of an array; Error naming the array's dtype when shardwise has none.
DType dtype_of(const AnyArray& array, std::string_view what);

// A Tensor over the array's memory (no copy); it keeps the array's owner alive. Error, naming
// `what`, for a non-contiguous array (pass np.ascontiguousarray(x) to copy it explicitly).
Tensor tensor_from(const AnyArray& array, std::string_view what);

// An array over the tensor's storage (no copy); the storage lives as long as the array does.
nb::object array_from(const Tensor& tensor);

}  // namespace shardwise::py
