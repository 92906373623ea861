#pragma once
// The fake device's memory opened for host access while a HostWindow lives (ops/fake_device_kernels.h):
// host views of device tensors, and the device tensors of a CPU kernel's host results. Internal to
// the fake device's kernel table (fake_device_kernels.cc, fake_device_moe.cc).
#include <memory>
#include <span>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/tensor/current_stream.h"
#include "shardwise/tensor/device_copy.h"
#include "shardwise/tensor/fake_device.h"

namespace shardwise::ops {

// The fake device's memory opened for host access while it lives: host views of device tensors,
// and the device tensors of a CPU kernel's host results.
class HostWindow {
 public:
  explicit HostWindow(Device device) : device_(device) {
    fake_ = dynamic_cast<FakeDeviceMemory*>(&device_memory(device));
    SW_CHECK(fake_ != nullptr, "the fake device's kernels run on the fake device only; {} is another device",
             device.to_string());
  }
  HostWindow(const HostWindow&) = delete;
  HostWindow& operator=(const HostWindow&) = delete;
  ~HostWindow() {
    for (const void* p : opened_) fake_->close_for_host(p);
  }

  FakeDeviceMemory& memory() const { return *fake_; }
  Device device() const { return device_; }

  // A kernel launched on the thread's current stream (the fake device's stream log).
  void note_launch() { fake_->note_launch(current_stream()); }

  // A host tensor over a device tensor's memory (it keeps the device tensor alive); `write`: the
  // kernel writes it (the stream check's access kind).
  Tensor view(const Tensor& t, bool write) {
    if (!t.on_device()) return t;  // undefined
    const void* p = t.device_ptr();
    fake_->open_for_host(p, t.nbytes(), write);
    opened_.push_back(p);
    auto* bytes = static_cast<std::byte*>(const_cast<void*>(p));
    return Tensor::adopt(t.dtype(), t.shape(), std::shared_ptr<std::byte[]>(std::make_shared<Tensor>(t), bytes));
  }
  std::vector<Tensor> views(std::span<const Tensor> ts) {
    std::vector<Tensor> out;
    out.reserve(ts.size());
    for (const Tensor& t : ts) out.push_back(view(t, false));  // an op's inputs: read only
    return out;
  }

  // A CPU kernel's result on the device: a view of device memory (a reshape of an input) stays
  // where it is; anything else goes to fresh device memory through the backend's own copy (not a
  // counted host-device copy: the fake device's host memory is its device memory).
  Tensor to_device(const Tensor& host) {
    if (!host.defined() || host.on_device()) return host;
    if (fake_->owns(host.raw())) return Tensor::adopt_device(host.dtype(), host.shape(), device_, host.storage());
    Tensor d = empty_on(host.dtype(), host.shape(), device_, current_stream());
    if (host.nbytes() > 0) fake_->copy_to_device(d.device_ptr(), host.raw(), host.nbytes(), current_stream());
    return d;
  }
  std::vector<Tensor> to_device(std::vector<Tensor> hosts) {
    for (Tensor& t : hosts) t = to_device(t);
    return hosts;
  }

 private:
  Device device_;
  FakeDeviceMemory* fake_ = nullptr;
  std::vector<const void*> opened_;
};

}  // namespace shardwise::ops
