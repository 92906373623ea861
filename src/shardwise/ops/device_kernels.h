#pragma once
// Kernels per device kind: an op whose inputs live on a device (tensor/device.h) runs the kernel
// that device kind's table holds for it, never its CPU kernel on a silent host copy. The tables are
// filled from outside the ops layer: the CUDA bindings (src/shardwise/cuda_ops/, where CUDA is
// built) and the fake device's table of the tests (ops/fake_device_kernels.h). run_forward /
// run_backward (op.h) come here when an input is on a device; host inputs never do.
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/ops/op.h"
#include "shardwise/ops/train_kernels.h"

namespace shardwise::ops {

// What a device's kernels do not compute, said before any launch: an op without a kernel in the
// table, or an attribute or layout its kernel refuses (the CUDA bindings name them). The verifier
// counts a check that meets one as skipped on the device, never as passed or failed. `reason()`
// is the message without the op and the device ("no cuda kernel", "the CUDA kernel does not
// compute ...").
class UnsupportedOnDevice : public Error {
 public:
  UnsupportedOnDevice(const std::string& message, std::string reason) : Error(message), reason_(std::move(reason)) {}
  const std::string& reason() const { return reason_; }

 private:
  std::string reason_;
};

// A device kernel takes the op (so one function can serve many ops: the fake table's fallback) and
// the same arguments as run_forward / run_backward; every defined tensor is on one device.
using DeviceForwardFn = std::function<std::vector<Tensor>(const OpDef&, std::span<const Tensor> inputs, const Attrs&,
                                                          const KernelContext*)>;
using DeviceBackwardFn = std::function<std::vector<Tensor>(
    const OpDef&, std::span<const Tensor> inputs, std::span<const Tensor> outputs, std::span<const Tensor> out_grads,
    const Attrs&, const KernelContext*, std::span<const bool> wanted)>;
// A tensor of `shape` filled with `value` on `device` (the runtime's Fill instructions).
using DeviceFillFn = std::function<Tensor(DType, const Shape&, double value, Device)>;

class DeviceKernelTable {
 public:
  explicit DeviceKernelTable(std::string name) : name_(std::move(name)) {}
  const std::string& name() const { return name_; }  // "cuda", "fake"
  // Error when the op already has one.
  void add_forward(std::string op, DeviceForwardFn fn);
  void add_backward(std::string op, DeviceBackwardFn fn);
  // For every op without a kernel of its own (the fake table runs each op's CPU kernel).
  void set_fallback(DeviceForwardFn forward, DeviceBackwardFn backward);
  void set_fill(DeviceFillFn fill) { fill_ = std::move(fill); }
  // The optimizer's kernels (train_kernels.h): AdamW, sums of squares, scaling, gradient sums.
  void set_train_kernels(DeviceTrainKernels kernels) { train_ = std::move(kernels); }
  const DeviceTrainKernels& train_kernels() const { return train_; }
  const DeviceForwardFn* forward(std::string_view op) const;    // null when none
  const DeviceBackwardFn* backward(std::string_view op) const;  // null when none
  const DeviceFillFn* fill() const { return fill_ ? &fill_ : nullptr; }
  // The ops with a kernel of their own (not the fallback's), sorted.
  std::vector<std::string> forward_ops() const;
  std::vector<std::string> backward_ops() const;

 private:
  std::string name_;
  std::map<std::string, DeviceForwardFn, std::less<>> forward_;
  std::map<std::string, DeviceBackwardFn, std::less<>> backward_;
  DeviceForwardFn fallback_forward_;
  DeviceBackwardFn fallback_backward_;
  DeviceFillFn fill_;
  DeviceTrainKernels train_;
};

// Installs the table of a device kind (null removes it); returns the one it replaces. Done before
// any rank runs (the tables are read concurrently by rank threads).
std::shared_ptr<const DeviceKernelTable> install_device_kernels(DeviceKind kind,
                                                                std::shared_ptr<const DeviceKernelTable> table);
std::shared_ptr<const DeviceKernelTable> device_kernels(DeviceKind kind);  // null when none

// The device of the first defined tensor on a device, or null when every tensor is on the host.
inline const Tensor* first_on_device(std::span<const Tensor> tensors) {
  for (const Tensor& t : tensors) {
    if (t.on_device()) [[unlikely]] return &t;
  }
  return nullptr;
}

// The device kernel of `op` for `device` run on `inputs`: an Error naming the op and the device when
// its kind has no table (an UnsupportedOnDevice when the table has no kernel for the op), or naming
// the tensor when the tensors are not all on `device`.
std::vector<Tensor> run_device_forward(const OpDef& op, Device device, std::span<const Tensor> inputs,
                                       const Attrs& attrs, const KernelContext* context);
std::vector<Tensor> run_device_backward(const OpDef& op, Device device, std::span<const Tensor> inputs,
                                        std::span<const Tensor> outputs, std::span<const Tensor> out_grads,
                                        const Attrs& attrs, const KernelContext* context, std::span<const bool> wanted);
// A filled tensor on `device` through its table's fill (Error naming the device when none).
Tensor fill_on_device(DType dtype, const Shape& shape, double value, Device device);

}  // namespace shardwise::ops
