#include "shardwise/ops/device_kernels.h"

#include <array>
#include <mutex>

#include "shardwise/core/error.h"

namespace shardwise::ops {

namespace {

constexpr size_t kKinds = 2;  // DeviceKind::Host, DeviceKind::Cuda

struct Tables {
  std::mutex mutex;
  std::array<std::shared_ptr<const DeviceKernelTable>, kKinds> by_kind;
};

Tables& tables() {
  static Tables t;
  return t;
}

template <class Map>
std::vector<std::string> keys(const Map& m) {
  std::vector<std::string> out;
  for (const auto& [name, fn] : m) out.push_back(name);
  return out;
}

// Every defined tensor of `group` on `device`, else an Error naming the op, the tensor and both devices.
void check_on(const OpDef& op, Device device, std::span<const Tensor> group, std::string_view what) {
  for (size_t i = 0; i < group.size(); ++i) {
    const Tensor& t = group[i];
    SW_CHECK(!t.defined() || t.device() == device,
             "op '{}': {} {} is on {} but the others are on {}; move it with an explicit copy (tensor/device_copy.h)",
             op.name, what, i, t.device().to_string(), device.to_string());
  }
}

std::shared_ptr<const DeviceKernelTable> table_for(const OpDef& op, Device device) {
  std::shared_ptr<const DeviceKernelTable> table = device_kernels(device.kind);
  SW_CHECK(table != nullptr,
           "op '{}': its inputs are on {}, and no device kernels are installed for that device kind (a build "
           "without CUDA, or a run that did not ask for the device)",
           op.name, device.to_string());
  return table;
}

}  // namespace

void DeviceKernelTable::add_forward(std::string op, DeviceForwardFn fn) {
  SW_CHECK(fn != nullptr, "device kernels '{}': an empty forward kernel for op '{}'", name_, op);
  SW_CHECK(!forward_.contains(op), "device kernels '{}': op '{}' has a forward kernel already", name_, op);
  forward_.emplace(std::move(op), std::move(fn));
}

void DeviceKernelTable::add_backward(std::string op, DeviceBackwardFn fn) {
  SW_CHECK(fn != nullptr, "device kernels '{}': an empty backward kernel for op '{}'", name_, op);
  SW_CHECK(!backward_.contains(op), "device kernels '{}': op '{}' has a backward kernel already", name_, op);
  backward_.emplace(std::move(op), std::move(fn));
}

void DeviceKernelTable::set_fallback(DeviceForwardFn forward, DeviceBackwardFn backward) {
  fallback_forward_ = std::move(forward);
  fallback_backward_ = std::move(backward);
}

const DeviceForwardFn* DeviceKernelTable::forward(std::string_view op) const {
  if (auto it = forward_.find(op); it != forward_.end()) return &it->second;
  return fallback_forward_ ? &fallback_forward_ : nullptr;
}

const DeviceBackwardFn* DeviceKernelTable::backward(std::string_view op) const {
  if (auto it = backward_.find(op); it != backward_.end()) return &it->second;
  return fallback_backward_ ? &fallback_backward_ : nullptr;
}

std::vector<std::string> DeviceKernelTable::forward_ops() const { return keys(forward_); }
std::vector<std::string> DeviceKernelTable::backward_ops() const { return keys(backward_); }

std::shared_ptr<const DeviceKernelTable> install_device_kernels(DeviceKind kind,
                                                                std::shared_ptr<const DeviceKernelTable> table) {
  SW_CHECK(kind != DeviceKind::Host, "device kernels: the host runs every op's CPU kernel; no table is installed for it");
  Tables& t = tables();
  std::lock_guard lock(t.mutex);
  std::swap(t.by_kind[static_cast<size_t>(kind)], table);
  return table;
}

std::shared_ptr<const DeviceKernelTable> device_kernels(DeviceKind kind) {
  Tables& t = tables();
  std::lock_guard lock(t.mutex);
  return t.by_kind[static_cast<size_t>(kind)];
}

std::vector<Tensor> run_device_forward(const OpDef& op, Device device, std::span<const Tensor> inputs,
                                       const Attrs& attrs, const KernelContext* context) {
  check_on(op, device, inputs, "input");
  const auto table = table_for(op, device);
  const DeviceForwardFn* fn = table->forward(op.name);
  if (fn == nullptr) {
    throw UnsupportedOnDevice(fmt::format("op '{}' has no {} kernel for its inputs on {} (the ops with one: {})", op.name,
                                          table->name(), device.to_string(), fmt::join(table->forward_ops(), ", ")),
                              fmt::format("no {} kernel", table->name()));
  }
  return (*fn)(op, inputs, attrs, context);
}

std::vector<Tensor> run_device_backward(const OpDef& op, Device device, std::span<const Tensor> inputs,
                                        std::span<const Tensor> outputs, std::span<const Tensor> out_grads,
                                        const Attrs& attrs, const KernelContext* context, std::span<const bool> wanted) {
  check_on(op, device, inputs, "input");
  check_on(op, device, outputs, "output");
  check_on(op, device, out_grads, "output gradient");
  const auto table = table_for(op, device);
  const DeviceBackwardFn* fn = table->backward(op.name);
  if (fn == nullptr) {
    throw UnsupportedOnDevice(fmt::format("op '{}' has no {} gradient kernel for its tensors on {} (the ops with one: {})",
                                          op.name, table->name(), device.to_string(),
                                          fmt::join(table->backward_ops(), ", ")),
                              fmt::format("no {} gradient kernel", table->name()));
  }
  return (*fn)(op, inputs, outputs, out_grads, attrs, context, wanted);
}

Tensor fill_on_device(DType dtype, const Shape& shape, double value, Device device) {
  SW_CHECK(!device.is_host(), "fill_on_device: {} is the host", device.to_string());
  const auto table = device_kernels(device.kind);
  SW_CHECK(table != nullptr && table->fill() != nullptr, "no fill kernel for {} (a {} {} filled with {})",
           device.to_string(), dtype_name(dtype), shape.to_string(), value);
  return (*table->fill())(dtype, shape, value, device);
}

}  // namespace shardwise::ops
