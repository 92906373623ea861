#pragma once
// Asynchronous checkpoint saves. save() runs the checks and the plan with the caller (collective,
// so every rank's Error is the same and raised at once), copies this rank's blocks into host
// buffers that are kept and reused by later saves (a block in device memory by one device-to-host
// copy into a staging buffer, device_staging.h), and returns; a background thread writes and
// commits from those copies. The next save() (or finish()) waits for the one in flight and raises its error: a
// writer error is never swallowed. A crash during a background save leaves the previous complete
// checkpoint as the one resume() finds (commit protocol, commit.h).
//
// The background thread uses only tagged send/recv on the communicator (never a collective), so
// the caller may keep running collectives on it; the communicator must outlive the save. On a
// communicator without send/recv (comm::has_point_to_point: the exchange backend over an
// all-gather only) it makes collectives instead, and the caller makes no call on that communicator
// until finish().
#include <chrono>
#include <exception>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "shardwise/ckpt/checkpoint.h"
#include "shardwise/ckpt/device_staging.h"

namespace shardwise::ckpt {

class AsyncSaver {
 public:
  explicit AsyncSaver(SaveOptions options = {}) : options_(std::move(options)) {}
  ~AsyncSaver();  // waits; an error finish() did not raise is printed to stderr
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;

  void save(comm::Communicator& comm, const fs::path& root, const CheckpointContent& content);
  // Waits for the save in flight; returns its directory or raises its error.
  std::optional<fs::path> finish();
  // How long the last save() kept the caller (waiting for the previous save included).
  std::chrono::duration<double> last_blocking_time() const { return blocked_; }
  // Bytes held in host buffers (reused across saves).
  size_t staging_bytes() const;

 private:
  SaveOptions options_;
  std::thread worker_;
  std::exception_ptr error_;
  std::optional<fs::path> done_;
  StagingBuffers staging_;  // "group/name" -> this rank's block
  std::chrono::duration<double> blocked_{0};
};

}  // namespace shardwise::ckpt
