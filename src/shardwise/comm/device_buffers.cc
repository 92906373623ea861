#include "shardwise/comm/device_buffers.h"

#include "shardwise/core/error.h"

namespace shardwise::comm {
namespace {
thread_local const DeviceBuffers* innermost = nullptr;
}  // namespace

DeviceBuffers::DeviceBuffers(Device device, Stream stream)
    : device(device), stream(stream), previous_(innermost) {
  SW_CHECK(!device.is_host(), "comm::DeviceBuffers on the host: host buffers need no scope");
  innermost = this;
}

DeviceBuffers::~DeviceBuffers() { innermost = previous_; }

const DeviceBuffers* DeviceBuffers::current() { return innermost; }

HostBuffers::HostBuffers() : suspended_(innermost) { innermost = nullptr; }

HostBuffers::~HostBuffers() { innermost = suspended_; }

}  // namespace shardwise::comm
