#include "arrays.h"

#include <fmt/format.h>

#include "shardwise/core/error.h"
#include "shardwise/tensor/device_memory.h"

namespace shardwise::py {
namespace {

// Keeps the caller's array (and so its owner) alive while a Tensor's storage is in use; let go of
// under the GIL, whichever thread drops the last reference.
struct ArrayOwner {
  AnyArray array;
  void operator()(std::byte*) {
    nb::gil_scoped_acquire gil;
    array = AnyArray();
  }
};

nb::dlpack::dtype dl_dtype(DType dtype) {
  using nb::dlpack::dtype_code;
  switch (dtype) {
    case DType::F32: return {static_cast<uint8_t>(dtype_code::Float), 32, 1};
    case DType::F64: return {static_cast<uint8_t>(dtype_code::Float), 64, 1};
    case DType::F16: return {static_cast<uint8_t>(dtype_code::Float), 16, 1};
    case DType::BF16: return {static_cast<uint8_t>(dtype_code::Bfloat), 16, 1};
    case DType::I64: return {static_cast<uint8_t>(dtype_code::Int), 64, 1};
    case DType::I32: return {static_cast<uint8_t>(dtype_code::Int), 32, 1};
    case DType::I8: return {static_cast<uint8_t>(dtype_code::Int), 8, 1};
    case DType::U8: return {static_cast<uint8_t>(dtype_code::UInt), 8, 1};
    case DType::Bool: return {static_cast<uint8_t>(dtype_code::Bool), 8, 1};
    case DType::U16: return {static_cast<uint8_t>(dtype_code::UInt), 16, 1};
    case DType::U32: return {static_cast<uint8_t>(dtype_code::UInt), 32, 1};
    case DType::U64: return {static_cast<uint8_t>(dtype_code::UInt), 64, 1};
  }
  fail("dtype {} has no DLPack code", dtype_name(dtype));
}

std::string dl_name(nb::dlpack::dtype d) {
  static const char* codes[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  const char* code = d.code < 7 ? codes[d.code] : "code";
  return fmt::format("{}{}{}", code, d.bits, d.lanes == 1 ? "" : fmt::format("x{}", d.lanes));
}

}  // namespace

DType dtype_of(const AnyArray& array, std::string_view what) {
  nb::dlpack::dtype d = array.dtype();
  for (DType t : kAllDTypes) {
    if (dl_dtype(t) == d) return t;
  }
  for (DType t : kStorageOnlyDTypes) {
    if (dl_dtype(t) == d) return t;
  }
  fail("{}: dtype {} is not one shardwise holds (f32, f64, f16, bf16, i64, i32, i8, u8, bool, u16, u32, u64)", what,
       dl_name(d));
}

std::string device_name(const AnyArray& array) {
  const int type = array.device_type(), id = array.device_id();
  if (type == nb::device::cpu::value || type == nb::device::cuda_host::value) return "host";
  if (type == nb::device::cuda::value || type == nb::device::cuda_managed::value) return Device::cuda(id).to_string();
  return fmt::format("dlpack device {}:{}", type, id);
}

namespace {

bool on_cuda(const AnyArray& array) {
  return array.device_type() == nb::device::cuda::value || array.device_type() == nb::device::cuda_managed::value;
}

// The array's dtype and shape, checked as every array is: a known dtype, at most kMaxDims dims,
// C-contiguous (an Error naming `what` otherwise; nothing is read).
std::pair<DType, Shape> checked_layout(const AnyArray& array, std::string_view what) {
  DType dtype = dtype_of(array, what);
  SW_CHECK(array.ndim() <= static_cast<size_t>(kMaxDims), "{}: {} dims; shardwise tensors have at most {}", what,
           array.ndim(), kMaxDims);
  std::vector<int64_t> dims(array.ndim());
  int64_t expected = 1;
  bool contiguous = true;
  for (size_t i = array.ndim(); i-- > 0;) {
    dims[i] = static_cast<int64_t>(array.shape(i));
    if (dims[i] != 1 && array.stride(i) != expected) contiguous = false;
    expected *= dims[i];
  }
  Shape shape{std::span<const int64_t>(dims)};
  if (!contiguous) {
    std::vector<int64_t> strides(array.ndim());
    for (size_t i = 0; i < array.ndim(); ++i) strides[i] = array.stride(i);
    const std::string where = device_name(array);
    fail("{}: the array of shape {} is not C-contiguous (strides in elements: {}{}); shardwise reads arrays "
         "without copying them, so pass a contiguous one (numpy.ascontiguousarray(x), x.contiguous())",
         what, shape.to_string(), fmt::join(strides, ","), where == "host" ? "" : "; on " + where);
  }
  return {dtype, shape};
}

std::shared_ptr<std::byte[]> owned_memory(const AnyArray& array) {
  auto* data = static_cast<std::byte*>(const_cast<void*>(array.data()));
  return std::shared_ptr<std::byte[]>(data, ArrayOwner{array});
}

}  // namespace

Tensor tensor_from(const AnyArray& array, std::string_view what, std::string_view api) {
  if (device_name(array) != "host") {
    fail("{}: {} reads host memory, and this array is on {}; copy it to the host first (x.cpu(), "
         "shardwise.to_host(x))", what, api, device_name(array));
  }
  auto [dtype, shape] = checked_layout(array, what);
  return Tensor::adopt(dtype, shape, owned_memory(array));
}

Tensor tensor_on_device(const AnyArray& array, std::string_view what) {
  const std::string where = device_name(array);
  if (where == "host") return tensor_from(array, what, "");
  SW_CHECK(on_cuda(array), "{}: the array is on {}, which shardwise does not know (host and CUDA arrays only); "
           "copy it to the host first (x.cpu())", what, where);
  const Device device = Device::cuda(array.device_id());
  if (!has_device_memory(device)) register_cuda_devices();
  if (!has_device_memory(device)) {
    fail("{}: the array is on {}, but {}; copy it to the host first (x.cpu(), or shardwise.to_host(x) where "
         "shardwise has the device)", what, where, cuda_built() ? "shardwise sees no such GPU" : "this shardwise "
         "package was built without CUDA (rebuild it where the CUDA toolkit is found)");
  }
  auto [dtype, shape] = checked_layout(array, what);
  return Tensor::adopt_device(dtype, shape, device, owned_memory(array));
}

nb::object array_from(const Tensor& tensor) {
  SW_CHECK(tensor.defined(), "no tensor to return (undefined)");
  // A handle on the tensor keeps its storage (host or device) alive as long as the array lives.
  auto* keep = new Tensor(tensor);
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  std::vector<size_t> shape(tensor.shape().begin(), tensor.shape().end());
  if (tensor.on_device()) {
    // No NumPy here: an array object that speaks DLPack (torch.from_dlpack, cupy.from_dlpack).
    return nb::cast(nb::ndarray<nb::array_api>(keep->device_ptr(), shape.size(), shape.data(), owner, nullptr,
                                               dl_dtype(tensor.dtype()), nb::device::cuda::value,
                                               tensor.device().index));
  }
  nb::ndarray<> array(const_cast<std::byte*>(tensor.raw()), shape.size(), shape.data(), owner, nullptr,
                      dl_dtype(tensor.dtype()), nb::device::cpu::value);
  if (tensor.dtype() == DType::BF16) {
    // NumPy has no bfloat16: an array object that speaks DLPack (torch.from_dlpack) and the buffer
    // protocol, with shape and dtype.
    return nb::cast(nb::ndarray<nb::array_api>(array));
  }
  return nb::cast(nb::ndarray<nb::numpy>(array));
}

}  // namespace shardwise::py
