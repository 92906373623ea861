#pragma once
// Collectives on device memory. While a DeviceBuffers scope is alive, every buffer this thread
// passes to a communicator's collectives and point-to-point calls (the Communicator methods taking
// pointers, their start_* forms included) is device memory of `device`, and the call's work is
// queued on `stream`, the caller's stream:
// - the inputs are read after the work queued on `stream` before the call (no host wait needed);
// - the outputs are ready for the work queued on `stream` after the call; the host sees them once
//   it synchronizes `stream` (DeviceMemory::synchronize) or copies them out on it;
// - every rank of a call passes device buffers alike (the local backend raises an Error naming both
//   ranks otherwise; MPI and NCCL cannot tell).
// The backends: local (threads of one process on one device) copies and reduces between the ranks'
// buffers with the device's own copies and reduction kernel (DeviceMemory::copy_on_device, reduce)
// on the callers' streams, ordered by events; MPI stages through host staging buffers
// (tensor/staging_pool.h); NCCL takes the pointers and the stream as they are. Host buffers (no
// scope) take the host paths unchanged. shared_regions and the byte / object helpers are host only.
#include "shardwise/tensor/device.h"

namespace shardwise::comm {

class DeviceBuffers {
 public:
  DeviceBuffers(Device device, Stream stream);
  ~DeviceBuffers();
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;
  // This thread's innermost scope, or null (host buffers).
  static const DeviceBuffers* current();

  const Device device;
  const Stream stream;

 private:
  friend class HostBuffers;
  const DeviceBuffers* previous_;
};

// While alive, this thread's calls take host buffers again (no DeviceBuffers scope): a backend
// staging device buffers through the host makes its host call inside one.
class HostBuffers {
 public:
  HostBuffers();
  ~HostBuffers();
  HostBuffers(const HostBuffers&) = delete;
  HostBuffers& operator=(const HostBuffers&) = delete;

 private:
  const DeviceBuffers* suspended_;
};

}  // namespace shardwise::comm
