#pragma once
// Runs a lowered program on one rank: local kernels on the rank's blocks, reshards through the
// planner's collectives, each buffer freed after its last use. Every rank of the mesh runs the
// same program at the same time (threads of one process or MPI processes).
#include <memory>
#include <string_view>
#include <vector>

#include "shardwise/comm/communicator.h"
#include "shardwise/graph/program.h"
#include "shardwise/reshard/executor.h"

namespace shardwise::runtime {

struct RunStats {
  int64_t peak_bytes = 0;        // most bytes held by this rank's buffers at once during run()
  int64_t bytes_sent = 0;        // bytes this rank sent to other ranks during run()
  int64_t kernels = 0, reshards = 0;
};

class Runtime {
 public:
  // `world`'s members must include every process of the program's mesh (their global ranks).
  Runtime(const graph::Graph& g, const graph::Program& p, std::shared_ptr<comm::Communicator> world);
  ~Runtime();

  // Binds an input or parameter: the global tensor (this rank keeps its block) or the block.
  void set_global(std::string_view name, const Tensor& global);
  void set_local(std::string_view name, const Tensor& local);
  // Values to keep after run() besides the leaves, the parameters' gradients and the values no
  // node reads (the loss): everything else is freed after its last use.
  void keep(std::string_view name);

  void run();
  const RunStats& stats() const { return stats_; }

  // This rank's block of a value in its completed distribution (an Error if it was freed).
  Tensor local(std::string_view name) const;
  // The gradient of a parameter, in the parameter's distribution.
  Tensor local_grad(std::string_view param) const;
  // Collective (every rank calls it): the whole global value, on every rank.
  Tensor gather(std::string_view name);
  Tensor gather_grad(std::string_view param);

 private:
  int value_slot(std::string_view name) const;
  Tensor gather_slot(int slot);
  ops::KernelContext context(const std::vector<int>& slots) const;
  void bind(int slot, Tensor t);

  const graph::Graph& g_;
  const graph::Program& p_;
  std::shared_ptr<comm::Communicator> world_;
  std::unique_ptr<comm::MeshComm> mesh_comm_;
  reshard::Resharder resharder_;
  std::vector<int64_t> coords_;
  std::vector<Tensor> buffers_;
  std::vector<int> last_use_;
  std::vector<bool> kept_;
  RunStats stats_;
};

}  // namespace shardwise::runtime
