#pragma once
// Runs a lowered program on one rank: local kernels on the rank's blocks, reshards through the
// planner's collectives, each buffer freed after its last use. Every rank of the mesh runs the
// same program at the same time (threads of one process or MPI processes).
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "shardwise/comm/communicator.h"
#include "shardwise/graph/program.h"
#include "shardwise/mesh/shard_math.h"
#include "shardwise/reshard/executor.h"

namespace shardwise::runtime {

class RankProfile;

struct RunStats {
  int64_t peak_bytes = 0;        // most bytes held by this rank's buffers at once during run()
  // Of those, the most held at once by parameters' copies in another distribution than their own
  // (sharding stage 3: the all-gathered working copies of dp-sharded parameters).
  int64_t peak_gathered_bytes = 0;
  int64_t bytes_sent = 0;        // bytes this rank sent to other ranks during run()
  int64_t kernels = 0, reshards = 0;
  int64_t prefetched = 0;  // reshards started before their position (RuntimeOptions::prefetch_params)
};

struct RuntimeOptions {
  // The order in which run() executes the instructions (a permutation of the program's; empty:
  // program order). Buffers are freed after their last use in this order.
  std::vector<int> order;
  // A gradient kernel's read of a forward tensor whose value it does not need (OpDef::
  // backward_reads) does not keep the tensor alive: it is freed after its last value use, and the
  // kernel gets a stand-in of the right shape (never read). Pipelines release this way what
  // backward does not need between a micro-batch's forward and its backward.
  bool release_shape_only_reads = false;
  // Stand-ins are filled with NaN (tests: a kernel that wrongly reads one produces NaN); else
  // they hold no memory (stand_in.h: shape_only_tensor).
  bool poison_stand_ins = false;
  // Sharding stage 3: the parameters' all-gathers of this many layers ahead are started (non-
  // blocking) at the first gather of a layer (graph/prefetch.h); 0: each gather blocks at its
  // position. The gathered copy's bytes count from its start. On a device the gathers are queued
  // on the communication stream at their start, and the compute stream waits for each at its use.
  int prefetch_params = 0;
};

class Runtime {
 public:
  // `world`'s members must include every process of the program's mesh (their global ranks).
  Runtime(const graph::Graph& g, const graph::Program& p, std::shared_ptr<comm::Communicator> world,
          RuntimeOptions options = {});
  ~Runtime();

  // Binds an input or parameter: the global tensor (this rank keeps its block) or the block.
  void set_global(std::string_view name, const Tensor& global);
  void set_local(std::string_view name, const Tensor& local);
  // The block of an input this rank holds (its global offsets and local shape), as set_global cuts it.
  mesh::LocalBlock local_block(std::string_view name) const;
  // Values to keep after run() besides the leaves, the parameters' gradients and the values no
  // node reads (the loss): everything else is freed after its last use.
  void keep(std::string_view name);
  // A leaf bound for one run only (a pipeline stage's received input or output gradient, a
  // micro-batch's ids): freed after its last use instead of kept.
  void free_after_use(std::string_view name);
  // Frees the buffer of a value now (it may be bound or computed again later).
  void drop(std::string_view name);

  void run();
  // Index of the first sample of the batch run() processes (random ops key their draws by it).
  void set_sample_offset(int64_t first_sample) { sample_offset_ = first_sample; }
  int64_t sample_offset() const { return sample_offset_; }
  // Positions [begin, end) of the execution order only (a pipeline runs a micro-batch's forward,
  // later its backward).
  void run(size_t begin, size_t end);
  size_t size() const { return order_.size(); }
  // Called by run() after each instruction (its position in the execution order), once its outputs
  // are stored and the buffers it read last are freed (the pipeline hands finished gradients on).
  void set_after_instr(std::function<void(size_t position)> f) { after_instr_ = std::move(f); }
  // Frees a slot's buffer now, also a kept one; from the after_instr callback, the run's byte count
  // (RunStats::peak_bytes) goes down with it (the pipeline lets a handed-over gradient go).
  void release(int slot);
  // Every slot's buffer: a pipeline keeps one set per micro-batch in flight and swaps it in.
  const std::vector<Tensor>& buffers() const { return buffers_; }
  void set_buffers(std::vector<Tensor> buffers);
  std::vector<Tensor> take_buffers();
  const RunStats& stats() const { return stats_; }

  // This rank's block of a value in its completed distribution (an Error if it was freed).
  Tensor local(std::string_view name) const;
  // The gradient of a parameter, in the parameter's distribution.
  Tensor local_grad(std::string_view param) const;
  // Collective (every rank calls it): the whole global value, on every rank.
  Tensor gather(std::string_view name);
  Tensor gather_grad(std::string_view param);
  // A run on a device (its bound tensors are there; ops run their device kernels, device_kernels.h):
  // its kernels go on this rank's compute stream and its reshards on its communication stream, each
  // ordered after the other's work with an event; the host waits for neither. Read a result with
  // to_host(t, stream()). Both {} (the default stream) on the host and before the first device run.
  Stream stream() const { return streams_ ? streams_->compute : Stream{}; }
  Stream comm_stream() const { return streams_ ? streams_->comm : Stream{}; }
  // Creates the streams on `device` now, as the first device run does (a pipeline stage receives
  // its input before its first run); an Error if they are another device's.
  void use_device(Device device);
  // Runs on `other`'s streams from now on (its own first: a device run's): a pipeline rank's stages
  // run on one compute and one communication stream, so what one stage makes another stage, or the
  // optimizer on stream(), reads in order. The streams go with the last runtime holding them.
  void share_streams(const Runtime& other);
  // A reshard run by another resharder (a pipeline's transfers between stages, on its own
  // communicator) as this runtime runs its own: on a device, on the communication stream after an
  // event of the compute stream, the compute stream going on after an event of the communication
  // stream. `device`: the run's (a process outside the plan's source mesh gets its block there);
  // the host runs the plan plainly.
  Tensor transfer(reshard::Resharder& resharder, const reshard::Plan& plan, const Tensor& in, Device device);
  int value_slot(std::string_view name) const;  // the slot of a value in its completed distribution
  int grad_slot(std::string_view param) const;  // Error unless a parameter whose gradient is held

 private:
  bool reads_value(const graph::Instr& ins, size_t k) const;  // does input k's value matter
  Tensor stand_in(int slot, Device device) const;
  Tensor gather_slot(int slot);
  // A reshard of `in`; on a device, on the communication stream between two events.
  Tensor reshard(const reshard::Plan& plan, const Tensor& in);
  // A gather started ahead of its use (prefetch_params): on the host a started all-gather; on a
  // device the reshard queued on the communication stream now (`done`: its event), the compute
  // stream waiting for it where it is used (wait_on_compute).
  struct Prefetched {
    std::unique_ptr<reshard::StartedReshard> host;
    Tensor out;
    uint64_t done = 0;
    bool fresh = false;  // `out` is new device memory (not the input's)
    int64_t nbytes() const { return host ? host->nbytes() : static_cast<int64_t>(out.nbytes()); }
  };
  // reshard()'s halves on a device: queued on the communication stream after the compute stream's
  // work so far; then the compute stream's wait for it. wait_on_compute also waits for a host start.
  Prefetched reshard_on_comm(reshard::Resharder& resharder, const reshard::Plan& plan, const Tensor& in, Device device);
  Tensor wait_on_compute(Prefetched& queued);
  struct DeviceStreams {
    Device device;
    Stream compute, comm;
  };
  ops::KernelContext context(const std::vector<int>& slots) const;
  void bind(int slot, Tensor t);
  // --profile: one event for the instruction just run (profiler.h).
  void record_instr(RankProfile& profile, size_t pos, const graph::Instr& ins, const std::vector<Tensor>& in,
                    const std::vector<Tensor>& out, int64_t started);

  const graph::Graph& g_;
  const graph::Program& p_;
  RuntimeOptions options_;
  std::vector<int> order_;
  std::shared_ptr<comm::Communicator> world_;
  std::unique_ptr<comm::MeshComm> mesh_comm_;
  reshard::Resharder resharder_;
  std::vector<int64_t> coords_;
  std::vector<Tensor> buffers_;
  std::vector<int> last_use_;
  std::vector<bool> kept_;
  std::vector<bool> unproduced_;  // per slot: made by no instruction nor bound (a shape-only stand-in)
  std::vector<bool> gathered_;  // per slot: a parameter's copy in another distribution (RunStats)
  RunStats stats_;
  std::function<void(size_t)> after_instr_;
  int64_t live_ = 0;  // run(): the bytes of the buffers held
  int64_t sample_offset_ = 0;
  // --profile: per position, the interned event name and detail in profile_of_text_.
  std::vector<std::pair<int32_t, int32_t>> profile_text_;
  // prefetch_params: per run range, the positions whose gathers start at each position.
  std::map<std::pair<size_t, size_t>, std::vector<std::vector<size_t>>> prefetch_starts_;
  std::map<size_t, Prefetched> started_;  // by position, during run()
  uint64_t profile_of_text_ = 0;  // RankProfile::serial()
  std::shared_ptr<const DeviceStreams> streams_;  // shared by a pipeline rank's stages (share_streams)
};

}  // namespace shardwise::runtime
