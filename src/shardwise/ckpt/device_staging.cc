#include "shardwise/ckpt/device_staging.h"

#include <cstring>

#include "shardwise/ckpt/save_plan.h"
#include "shardwise/core/error.h"
#include "shardwise/tensor/current_stream.h"
#include "shardwise/tensor/device_copy.h"

namespace shardwise::ckpt {

Tensor to_device_staged(const Tensor& host, Device device) {
  SW_CHECK(host.defined(), "copy to {}: the tensor is undefined", device.to_string());
  Tensor out = empty_on(host.dtype(), host.shape(), device, current_stream());  // the stream that copies into it
  copy_into_device(host, out);
  return out;
}

void copy_into_device(const Tensor& host, Tensor& dst) {
  SW_CHECK(host.defined() && dst.defined(), "copy into device: a tensor is undefined");
  SW_CHECK(!host.on_device(), "copy into device: the source {} {} is on {}, not the host", dtype_name(host.dtype()),
           host.shape().to_string(), host.device().to_string());
  SW_CHECK(host.dtype() == dst.dtype() && host.shape() == dst.shape(),
           "copy into device: the host tensor is {} {}, the device tensor on {} is {} {}", dtype_name(host.dtype()),
           host.shape().to_string(), dst.device().to_string(), dtype_name(dst.dtype()), dst.shape().to_string());
  StagingBuffer buf = staging_buffer(dst.device(), host.nbytes());
  if (host.nbytes() > 0) std::memcpy(buf.data(), host.raw(), host.nbytes());
  copy_from_host(buf.bytes(), dst, current_stream());
}

namespace detail {

void stage_blocks(const CheckpointContent& content, Sources& sources, StagingBuffers& buffers, bool host_too) {
  for (auto& [key, src] : sources) {
    const TensorGroup& group = content.groups[key.first];
    const DistTensor& t = group.tensors[key.second];
    const bool device = t.local.on_device();
    if (!device && !host_too) continue;
    StagingBuffer& buf = buffers[group.name + "/" + t.name];
    if (buf.data() != nullptr && buf.device() == t.local.device()) {
      buf.resize(t.local.nbytes());
    } else {
      buf = staging_buffer(t.local.device(), t.local.nbytes());
    }
    if (device) {
      copy_to_host(t.local, buf.bytes(), current_stream());  // after the caller's work on its stream
    } else if (buf.size() > 0) {
      std::memcpy(buf.data(), t.local.raw(), buf.size());
    }
    src.data = buf.data();
  }
}

}  // namespace detail

}  // namespace shardwise::ckpt
