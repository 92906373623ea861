#pragma once
// A host-only backend's calls on device buffers (comm/device_buffers.h), through host staging
// buffers (tensor/staging_pool.h: page-locked on CUDA): the device inputs are copied to the host on
// the caller's stream, the host waits for them, the backend's own host call runs on the copies, and
// the outputs go back on the stream (the host waits for those copies too, then the staging buffers
// go back to the pool). Correct on every device and with any MPI (no CUDA-aware MPI needed), at the
// price of two host copies and two host waits a call: CUDA runs under mpirun use NCCL for speed.
// The MPI backend calls these when a DeviceBuffers scope is alive; each makes the same call on `c`
// with host buffers (inside a HostBuffers scope), so the call checks and errors are the host path's.
#include <span>

#include "shardwise/comm/communicator.h"
#include "shardwise/comm/device_buffers.h"

namespace shardwise::comm::staged {

void all_reduce(Communicator& c, const DeviceBuffers& d, const void* in, void* out, int64_t count, DType dtype,
                Reduce op);
void reduce(Communicator& c, const DeviceBuffers& d, const void* in, void* out, int64_t count, DType dtype, Reduce op,
            int root);
void broadcast(Communicator& c, const DeviceBuffers& d, void* buffer, int64_t count, DType dtype, int root);
void all_gather(Communicator& c, const DeviceBuffers& d, const void* in, void* out, int64_t count, DType dtype);
void all_gather_v(Communicator& c, const DeviceBuffers& d, const void* in, void* out, std::span<const int64_t> counts,
                  DType dtype);
void reduce_scatter(Communicator& c, const DeviceBuffers& d, const void* in, void* out, int64_t count, DType dtype,
                    Reduce op);
void reduce_scatter_v(Communicator& c, const DeviceBuffers& d, const void* in, void* out,
                      std::span<const int64_t> counts, DType dtype, Reduce op);
void all_to_all(Communicator& c, const DeviceBuffers& d, const void* in, void* out, int64_t count, DType dtype);
void all_to_all_v(Communicator& c, const DeviceBuffers& d, const void* in, std::span<const int64_t> send_counts,
                  void* out, std::span<const int64_t> recv_counts, DType dtype);
// `fill` runs first (on the device buffers, every peer's), then the pieces travel staged.
void all_to_all_pieces(Communicator& c, const DeviceBuffers& d, const void* in, const Pieces& send, void* out,
                       const Pieces& recv, DType dtype, const FillPieces& fill);
void send(Communicator& c, const DeviceBuffers& d, const void* in, int64_t count, DType dtype, int peer, int tag);
void recv(Communicator& c, const DeviceBuffers& d, void* out, int64_t count, DType dtype, int peer, int tag);

}  // namespace shardwise::comm::staged
