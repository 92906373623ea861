// Arrays on CUDA devices from Python: shardwise.to_host / to_device (explicit, counted copies
// through tensor/device_copy.h; none when the array is already where it is asked to be), the
// GPUs' registration in a CUDA build, and shardwise._core._testing, the test-only hooks that make
// fake-device arrays (tensor/fake_device.h) so `make test` proves the device plumbing without a GPU.
#include <fmt/format.h>
#include <nanobind/stl/vector.h>

#include <mutex>
#include <set>

#include "arrays.h"
#include "errors.h"
#include "shardwise/tensor/device_copy.h"
#include "shardwise/tensor/device_memory.h"
#include "shardwise/tensor/fake_device.h"
#ifdef SHARDWISE_PY_CUDA
#include "shardwise/cuda/memory/cuda_memory.h"
#include "shardwise/cuda/layers/kernels.h"
#endif

namespace shardwise::py {

bool cuda_built() {
#ifdef SHARDWISE_PY_CUDA
  return true;
#else
  return false;
#endif
}

void register_cuda_devices() {
#ifdef SHARDWISE_PY_CUDA
  static std::once_flag once;
  std::call_once(once, [] { cuda::register_devices(); });
#endif
}

nb::object run_device_op(const std::string& op, const std::vector<AnyArray>& inputs) {
  return raising(ErrorKind::Usage, [&]() -> nb::object {
    const bool bound = cuda_built() && (op == "gelu" || op == "silu") && inputs.size() == 1;
    for (size_t i = 0; i < inputs.size() && !bound; ++i) {
      const std::string where = device_name(inputs[i]);
      SW_CHECK(where == "host", "run_op: {} runs its CPU kernel here (no CUDA kernel of it is bound in the Python "
               "package{}), and input {} is on {}; copy it to the host first (x.cpu(), shardwise.to_host(x))",
               op, cuda_built() ? ": gelu and silu have one" : ", built without CUDA", i, where);
    }
    Tensor x = tensor_on_device(inputs[0], fmt::format("{} input 0", op));
#ifdef SHARDWISE_PY_CUDA
    Tensor y;
    {
      nb::gil_scoped_release release;
      y = cuda::activation(op == "gelu" ? cuda::Activation::Gelu : cuda::Activation::Silu, x);
      cuda::synchronize(y.device());
    }
    nb::list result;
    result.append(array_from(y));
    return result;
#else
    fail("run_op: {} has no CUDA kernel in this package (input on {})", op, x.device().to_string());
#endif
  });
}

namespace {

nb::object to_host_array(const AnyArray& array) {
  Tensor t = tensor_on_device(array, "to_host");
  if (!t.on_device()) return array_from(t);
  Tensor host;
  {
    nb::gil_scoped_release release;
    host = to_host(t);
  }
  return array_from(host);
}

nb::object to_device_array(const AnyArray& array, int index) {
  const Device device = Device::cuda(index);
  Tensor t = tensor_on_device(array, "to_device");
  if (t.device() == device) return array_from(t);
  SW_CHECK(!t.on_device(), "to_device: the array is on {}, not {}; shardwise copies between host and device only "
           "(go through the host: shardwise.to_host(x))", t.device().to_string(), device.to_string());
  register_cuda_devices();
  SW_CHECK(has_device_memory(device), "to_device: shardwise has no {} ({}); keep the array on the host",
           device.to_string(), cuda_built() ? "no such GPU is visible" : "this package was built without CUDA");
  Tensor on;
  {
    nb::gil_scoped_release release;
    on = to_device(t, device);
  }
  return array_from(on);
}

// Test-only (docs/python.md): fake devices and a look at arrays without reading their memory.
void bind_testing(nb::module_& m) {
  nb::module_ t = m.def_submodule("_testing", "Test-only hooks (python/tests): fake CUDA devices and what an "
                                              "array points at. Not an API; never use them outside tests.");
  t.def("register_fake_device", [](int index) {
    static std::set<int> registered;
    if (registered.insert(index).second) register_fake_device({.index = index});
  }, nb::arg("index"), "Registers a fake device (host memory mapped PROT_NONE outside copies) as cuda:index, once.");
  t.def("device_copy_stats", [] {
    DeviceCopyStats s = device_copy_stats();
    nb::dict d;
    d["to_device_copies"] = s.to_device_copies;
    d["to_device_bytes"] = s.to_device_bytes;
    d["to_host_copies"] = s.to_host_copies;
    d["to_host_bytes"] = s.to_host_bytes;
    return d;
  }, "The counted host/device copies of this process (tensor/device_copy.h).");
  t.def("data_ptr", [](const AnyArray& a) { return reinterpret_cast<uintptr_t>(a.data()); }, nb::arg("array"),
        "The address an array's data starts at (never read).");
  t.def("view", [](nb::object base, std::vector<size_t> shape, std::vector<int64_t> strides) {
    AnyArray a = nb::cast<AnyArray>(base);
    SW_CHECK(shape.size() == strides.size(), "view: {} dims but {} strides", shape.size(), strides.size());
    return nb::cast(nb::ndarray<nb::array_api>(a.data(), shape.size(), shape.data(), base, strides.data(),
                                               a.dtype(), a.device_type(), a.device_id()));
  }, nb::arg("array"), nb::arg("shape"), nb::arg("strides"),
        "A view of the array's memory with another shape and strides (in elements), on its device; unchecked.");
  t.def("cuda_array_at", [](int ordinal) {
    static float dummy[4];  // never read: only the device and layout of the array are looked at
    size_t shape[1] = {4};
    nb::capsule owner(dummy, [](void*) noexcept {});
    return nb::cast(nb::ndarray<nb::array_api>(dummy, 1, shape, owner, nullptr, nb::dtype<float>(),
                                               nb::device::cuda::value, ordinal));
  }, nb::arg("ordinal"), "A 4-element f32 DLPack array claiming to be on cuda:ordinal (its memory is never read).");
}

}  // namespace

void bind_devices(nb::module_& m) {
  m.attr("built_with_cuda") = cuda_built();
  m.def("to_host", [](const AnyArray& array) { return raising(ErrorKind::Usage, [&] { return to_host_array(array); }); },
        nb::arg("array"),
        "A host copy of an array on a CUDA device (counted, explicit); a host array comes back as is, no copy.");
  m.def("to_device", [](const AnyArray& array, int device) {
    return raising(ErrorKind::Usage, [&] { return to_device_array(array, device); });
  }, nb::arg("array"), nb::arg("device") = 0,
        "A copy of a host array on cuda:device (counted, explicit), as a DLPack array on it; an array already "
        "there comes back over the same memory, no copy. Needs a package built with CUDA and that GPU.");
  bind_testing(m);
}

}  // namespace shardwise::py
