#pragma once
// The stream a thread's device work goes on: each rank's thread runs its kernels on its compute
// stream and its collectives on its communication stream (runtime/runtime.h), and the device
// kernels launch on current_stream(). The default stream ({}) until a StreamScope says otherwise.
#include "shardwise/tensor/device.h"

namespace shardwise {

Stream current_stream();

// Makes `stream` the current stream of this thread until it goes (scopes nest).
class StreamScope {
 public:
  explicit StreamScope(Stream stream);
  ~StreamScope();
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  Stream previous_;
};

}  // namespace shardwise
