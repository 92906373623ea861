#include "shardwise/comm/device_staging.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/tensor/device_memory.h"
#include "shardwise/tensor/staging_pool.h"

namespace shardwise::comm::staged {
namespace {

size_t bytes_of(int64_t count, DType dtype) { return static_cast<size_t>(count) * dtype_size(dtype); }

int64_t sum(std::span<const int64_t> counts) {
  int64_t s = 0;
  for (int64_t c : counts) s += c;
  return s;
}

// One call's staging buffers: inputs copied in at in(), outputs copied back after run().
class Staging {
 public:
  // (A call stages at most kMaxBuffers buffers: out() keeps a pointer into buffers_.)
  explicit Staging(const DeviceBuffers& d) : d_(d), memory_(device_memory(d.device)) { buffers_.reserve(kMaxBuffers); }
  // A host copy of `bytes` of device memory `device` (after the stream's earlier work).
  const void* in(const void* device, size_t bytes) { return load(device, bytes).data(); }
  // A host buffer whose bytes go to device memory `device` after the call; `load`: it starts with
  // the device's bytes (a call that writes only part of it).
  void* out(void* device, size_t bytes, bool load_first = false) {
    StagingBuffer& b = load_first ? load(device, bytes) : add(bytes);
    outs_.emplace_back(device, &b);
    return b.data();
  }
  // The host call on the staged buffers, then the outputs back to the device.
  template <class Call>
  void run(Call&& call) {
    memory_.synchronize(d_.stream);  // the inputs are on the host
    {
      HostBuffers host;
      call();
    }
    for (auto& [device, b] : outs_) {
      if (b->size()) memory_.copy_to_device(device, b->data(), b->size(), d_.stream);
    }
    if (!outs_.empty()) memory_.synchronize(d_.stream);  // before the buffers go back to the pool
  }

 private:
  static constexpr size_t kMaxBuffers = 3;
  StagingBuffer& add(size_t bytes) {
    SW_CHECK(buffers_.size() < kMaxBuffers, "internal: a staged call of more than {} buffers", kMaxBuffers);
    buffers_.push_back(staging_buffer(d_.device, std::max<size_t>(bytes, 1)));
    buffers_.back().resize(bytes);
    return buffers_.back();
  }
  StagingBuffer& load(const void* device, size_t bytes) {
    StagingBuffer& b = add(bytes);
    if (bytes) memory_.copy_to_host(b.data(), device, bytes, d_.stream);
    return b;
  }
  const DeviceBuffers& d_;
  DeviceMemory& memory_;
  std::vector<StagingBuffer> buffers_;  // (reserved: out() keeps pointers into it)
  std::vector<std::pair<void*, StagingBuffer*>> outs_;
};

// The elements a set of pieces spans from its buffer's start.
int64_t extent(const Pieces& p) {
  int64_t end = 0;
  for (size_t i = 0; i < p.offset.size(); ++i) {
    if (p.count[i] > 0) end = std::max(end, p.offset[i] + p.count[i]);
  }
  return end;
}

}  // namespace

void all_reduce(Communicator& c, const DeviceBuffers& d, const void* in, void* out, int64_t count, DType dtype,
                Reduce op) {
  Staging s(d);
  const void* hin = s.in(in, bytes_of(count, dtype));
  void* hout = s.out(out, bytes_of(count, dtype));
  s.run([&] { c.all_reduce(hin, hout, count, dtype, op); });
}

void reduce(Communicator& c, const DeviceBuffers& d, const void* in, void* out, int64_t count, DType dtype, Reduce op,
            int root) {
  Staging s(d);
  const void* hin = s.in(in, bytes_of(count, dtype));
  void* hout = c.rank() == root ? s.out(out, bytes_of(count, dtype)) : nullptr;
  s.run([&] { c.reduce(hin, hout, count, dtype, op, root); });
}

void broadcast(Communicator& c, const DeviceBuffers& d, void* buffer, int64_t count, DType dtype, int root) {
  Staging s(d);
  void* h = c.rank() == root ? const_cast<void*>(s.in(buffer, bytes_of(count, dtype))) : s.out(buffer, bytes_of(count, dtype));
  s.run([&] { c.broadcast(h, count, dtype, root); });
}

void all_gather(Communicator& c, const DeviceBuffers& d, const void* in, void* out, int64_t count, DType dtype) {
  Staging s(d);
  const void* hin = s.in(in, bytes_of(count, dtype));
  void* hout = s.out(out, bytes_of(count * c.size(), dtype));
  s.run([&] { c.all_gather(hin, hout, count, dtype); });
}

void all_gather_v(Communicator& c, const DeviceBuffers& d, const void* in, void* out, std::span<const int64_t> counts,
                  DType dtype) {
  Staging s(d);
  const int64_t mine = static_cast<size_t>(c.rank()) < counts.size() ? counts[static_cast<size_t>(c.rank())] : 0;
  const void* hin = s.in(in, bytes_of(mine, dtype));
  void* hout = s.out(out, bytes_of(sum(counts), dtype));
  s.run([&] { c.all_gather_v(hin, hout, counts, dtype); });
}

void reduce_scatter(Communicator& c, const DeviceBuffers& d, const void* in, void* out, int64_t count, DType dtype,
                    Reduce op) {
  Staging s(d);
  const void* hin = s.in(in, bytes_of(count * c.size(), dtype));
  void* hout = s.out(out, bytes_of(count, dtype));
  s.run([&] { c.reduce_scatter(hin, hout, count, dtype, op); });
}

void reduce_scatter_v(Communicator& c, const DeviceBuffers& d, const void* in, void* out,
                      std::span<const int64_t> counts, DType dtype, Reduce op) {
  Staging s(d);
  const int64_t mine = static_cast<size_t>(c.rank()) < counts.size() ? counts[static_cast<size_t>(c.rank())] : 0;
  const void* hin = s.in(in, bytes_of(sum(counts), dtype));
  void* hout = s.out(out, bytes_of(mine, dtype));
  s.run([&] { c.reduce_scatter_v(hin, hout, counts, dtype, op); });
}

void all_to_all(Communicator& c, const DeviceBuffers& d, const void* in, void* out, int64_t count, DType dtype) {
  Staging s(d);
  const void* hin = s.in(in, bytes_of(count * c.size(), dtype));
  void* hout = s.out(out, bytes_of(count * c.size(), dtype));
  s.run([&] { c.all_to_all(hin, hout, count, dtype); });
}

void all_to_all_v(Communicator& c, const DeviceBuffers& d, const void* in, std::span<const int64_t> send_counts,
                  void* out, std::span<const int64_t> recv_counts, DType dtype) {
  Staging s(d);
  const void* hin = s.in(in, bytes_of(sum(send_counts), dtype));
  void* hout = s.out(out, bytes_of(sum(recv_counts), dtype));
  s.run([&] { c.all_to_all_v(hin, send_counts, hout, recv_counts, dtype); });
}

void all_to_all_pieces(Communicator& c, const DeviceBuffers& d, const void* in, const Pieces& send, void* out,
                       const Pieces& recv, DType dtype, const FillPieces& fill) {
  fill_every_peer(c, fill);
  Staging s(d);
  const void* hin = s.in(in, bytes_of(extent(send), dtype));
  void* hout = s.out(out, bytes_of(extent(recv), dtype), true);  // (only the receive pieces change)
  s.run([&] { c.all_to_all_pieces(hin, send, hout, recv, dtype); });
}

void send(Communicator& c, const DeviceBuffers& d, const void* in, int64_t count, DType dtype, int peer, int tag) {
  Staging s(d);
  const void* hin = s.in(in, bytes_of(count, dtype));
  s.run([&] { c.send(hin, count, dtype, peer, tag); });
}

void recv(Communicator& c, const DeviceBuffers& d, void* out, int64_t count, DType dtype, int peer, int tag) {
  Staging s(d);
  void* hout = s.out(out, bytes_of(count, dtype));
  s.run([&] { c.recv(hout, count, dtype, peer, tag); });
}

}  // namespace shardwise::comm::staged
