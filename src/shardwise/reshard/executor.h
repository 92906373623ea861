#pragma once
// Runs reshard plans on a Communicator.
#include <map>
#include <memory>
#include <vector>

#include "shardwise/comm/communicator.h"
#include "shardwise/reshard/blocks.h"
#include "shardwise/reshard/plan.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::reshard {

// A reshard started without waiting for it (Resharder::start): its output is allocated at the
// start; the input block must stay alive and unchanged until wait().
class StartedReshard {
 public:
  // This process's block under the plan's `to` (the same tensor as the blocking run gives).
  Tensor wait();
  int64_t nbytes() const { return static_cast<int64_t>(out_.nbytes()); }

 private:
  friend class Resharder;
  std::unique_ptr<comm::Request> request_;
  Tensor out_, packed_;  // packed_: when the pieces are not out_'s rows in order (unpacked at wait)
  std::vector<Box> boxes_;
  Box after_;
};

class Resharder {
 public:
  // `world` must hold every process of the meshes of the plans it runs (mesh process ids are
  // global ranks, i.e. entries of world->members()).
  explicit Resharder(std::shared_ptr<comm::Communicator> world);

  // This process's block under plan.to, from its block `local` under plan.from. A process outside
  // plan.from passes an undefined tensor; outside plan.to it gets one. Every process of either
  // mesh must call run with the same plan. `local` is never modified.
  // Device blocks: under a comm::DeviceBuffers scope (comm/device_buffers.h) the blocks are device
  // tensors of its device (a process outside plan.from gets its block there); the boxes move with
  // the device's 2-D copies (device_blocks.h), the collectives take device pointers, all on the
  // scope's stream; the result is ready for the work queued on that stream after the call.
  Tensor run(const Plan& plan, const Tensor& local);

  // Whether start() can run `plan` without blocking: one all-gather step (sharding stage 3's
  // parameter gathers) on a mesh holding this process.
  bool can_start(const Plan& plan) const;
  // Starts such a plan (Communicator::start_all_gather_v); every process of the group must start
  // the same plans in the same order and wait for them in that order. When the gathered pieces
  // are the rows of the output in rank order (a tensor-dim-0 gather) they land in place.
  std::unique_ptr<StartedReshard> start(const Plan& plan, const Tensor& local);

  // Bytes this process has sent to other processes so far (all runs).
  int64_t bytes_sent() const { return bytes_sent_; }

 private:
  comm::Communicator& group(const mesh::ProcessMesh& mesh, std::span<const int64_t> coords,
                            std::span<const int> dims);
  Tensor run_step(const Step& step, const Plan& plan, Tensor t);
  Tensor exchange(const Step& step, const Plan& plan, const Tensor& t, std::span<const int> dims);
  Tensor send_recv(const Step& step, const Plan& plan, const Tensor& t);

  std::shared_ptr<comm::Communicator> world_;
  int64_t me_ = 0;  // this process's global rank
  std::map<std::vector<int>, std::shared_ptr<comm::Communicator>> groups_;
  int64_t bytes_sent_ = 0;
};

}  // namespace shardwise::reshard
