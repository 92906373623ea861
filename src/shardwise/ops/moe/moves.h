#pragma once
// Where the MoE kernel's exchanges (kernels.h) run when its tensors are device memory: the block
// sums' all_gather and the rows' all_to_all_pieces on device buffers (comm/device_buffers.h, on the
// current stream), the gathered sums read on the host by one counted copy (the sizes every later
// exchange needs), the rows' buffers device memory. Null in MoeShard::moves: host buffers, as
// before. A device's kernel table that runs the CPU kernel on its memory supplies one (the fake
// device: ops/fake_device_kernels.h); the shared-memory exchange (MoeExchange::Shared) is host
// memory and is not taken then.
#include <cstddef>
#include <memory>
#include <span>

#include "shardwise/comm/communicator.h"

namespace shardwise::ops {

class MoeMoves {
 public:
  virtual ~MoeMoves() = default;

  // Device memory for one exchange's rows, addressable by the kernel's host code while it lives.
  class Rows {
   public:
    virtual ~Rows() = default;
    virtual std::byte* data() = 0;
  };

  // `gathered` [group.size() * mine.size()] (host) = every member's `mine` in group-rank order: an
  // all_gather on device memory, then one counted copy to the host.
  virtual void gather_sums(comm::Communicator& group, std::span<const double> mine, std::span<double> gathered) const = 0;
  // A buffer of `bytes` for rows (at least one byte is allocated).
  virtual std::unique_ptr<Rows> rows(size_t bytes) const = 0;
  // group.all_to_all_pieces(in, send, out, recv, dtype) on device buffers (in and out from rows()).
  virtual void exchange(comm::Communicator& group, const void* in, const comm::Pieces& send, void* out,
                        const comm::Pieces& recv, DType dtype) const = 0;
};

}  // namespace shardwise::ops
