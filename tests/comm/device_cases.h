#pragma once
// Collective calls on raw buffers shared by the device-buffer tests of the threads backend
// (test_local_device.cc) and MPI (comm_mpi/test_mpi_device.cc): each case's call on 2 to 4 ranks
// with uneven counts and empty shards, run with host buffers or with device buffers of a fake
// device (comm/device_buffers.h), so the two can be compared bit for bit.
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "shardwise/comm/communicator.h"
#include "shardwise/comm/device_buffers.h"
#include "shardwise/core/error.h"
#include "shardwise/tensor/device_copy.h"
#include "shardwise/tensor/device_memory.h"

namespace shardwise::comm::device_cases {

// One rank's call: its input and output sizes (elements) and the call on raw pointers.
struct Case {
  std::string name;
  DType dtype = DType::F32;
  std::function<int64_t(int rank, int n)> in_count, out_count;
  std::function<void(Communicator&, const void* in, void* out)> call;
};

inline Tensor input_of(const Case& c, int rank, int n) {
  std::mt19937 gen(static_cast<unsigned>(rank * 131 + n));
  std::uniform_real_distribution<double> dist(-2, 2);
  std::vector<double> v(static_cast<size_t>(c.in_count(rank, n)));
  for (double& x : v) x = dist(gen);
  return Tensor::from<double>(Shape{static_cast<int64_t>(v.size())}, v).to(c.dtype);
}

inline int64_t uneven(int r) { return (r * 3 + 1) % 4; }  // 1, 0, 3, 2: one empty shard from 2 ranks on
inline std::vector<int64_t> uneven_counts(int n) {
  std::vector<int64_t> c;
  for (int r = 0; r < n; ++r) c.push_back(uneven(r));
  return c;
}
inline int64_t total(int n) {
  int64_t t = 0;
  for (int r = 0; r < n; ++r) t += uneven(r);
  return t;
}
// all_to_all_v: rank q sends (q + 2p) % 3 elements to rank p.
inline std::vector<int64_t> sends(int q, int n) {
  std::vector<int64_t> c;
  for (int p = 0; p < n; ++p) c.push_back((q + 2 * p) % 3);
  return c;
}
inline std::vector<int64_t> receives(int p, int n) {
  std::vector<int64_t> c;
  for (int q = 0; q < n; ++q) c.push_back((q + 2 * p) % 3);
  return c;
}
inline int64_t sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

// all_to_all_pieces' pieces for rank `me` of `n`: two a peer q (1 element, then (me + q) % 3),
// the second before the first in the buffer; the receive side lays its peers out in reverse order.
struct PieceLists {
  std::vector<int64_t> first{0}, offset, count;
  Pieces view() const { return {first, offset, count}; }
};
inline PieceLists piece_lists(int me, int n, bool receive) {
  std::vector<int64_t> start(static_cast<size_t>(n));
  int64_t at = 0;
  for (int i = 0; i < n; ++i) {
    const int q = receive ? n - 1 - i : i;
    start[static_cast<size_t>(q)] = at;
    at += (me + q) % 3 + 1;
  }
  PieceLists l;
  for (int q = 0; q < n; ++q) {
    const int64_t a = (me + q) % 3, s = start[static_cast<size_t>(q)];
    l.offset.insert(l.offset.end(), {s + a, s});
    l.count.insert(l.count.end(), {1, a});
    l.first.push_back(static_cast<int64_t>(l.offset.size()));
  }
  return l;
}
inline int64_t piece_elements(int me, int n) {
  int64_t s = 0;
  for (int q = 0; q < n; ++q) s += (me + q) % 3 + 1;
  return s;
}
inline Case pieces_case() {
  return {"all_to_all_pieces", DType::F32, piece_elements, piece_elements, [](Communicator& c, const void* in, void* out) {
            const PieceLists send = piece_lists(c.rank(), c.size(), false), recv = piece_lists(c.rank(), c.size(), true);
            c.all_to_all_pieces(in, send.view(), out, recv.view(), DType::F32);
          }};
}

inline std::vector<Case> cases() {
  std::vector<Case> cs;
  auto fixed = [](int64_t k) { return [k](int, int) { return k; }; };
  for (DType dtype : {DType::F32, DType::BF16, DType::F64, DType::I64}) {
    for (Reduce op : {Reduce::Sum, Reduce::Avg, Reduce::Max, Reduce::Min}) {
      cs.push_back({fmt::format("all_reduce {} {}", dtype_name(dtype), reduce_name(op)), dtype, fixed(13), fixed(13),
                    [op, dtype](Communicator& c, const void* in, void* out) { c.all_reduce(in, out, 13, dtype, op); }});
    }
  }
  cs.push_back({"all_reduce in place", DType::BF16, fixed(9), fixed(9), [](Communicator& c, const void* in, void* out) {
                  c.all_reduce(in, out, 9, DType::BF16, Reduce::Sum);  // (out's copy of in first, below)
                  c.all_reduce(out, out, 9, DType::BF16, Reduce::Sum);
                }});
  cs.push_back({"all_reduce of nothing", DType::F32, fixed(0), fixed(0),
                [](Communicator& c, const void* in, void* out) { c.all_reduce(in, out, 0, DType::F32, Reduce::Sum); }});
  cs.push_back({"reduce to rank 1", DType::BF16, fixed(6), fixed(6),
                [](Communicator& c, const void* in, void* out) { c.reduce(in, out, 6, DType::BF16, Reduce::Sum, 1); }});
  cs.push_back({"reduce_scatter", DType::F32, [](int, int n) { return 3 * n; }, fixed(3),
                [](Communicator& c, const void* in, void* out) { c.reduce_scatter(in, out, 3, DType::F32, Reduce::Sum); }});
  cs.push_back({"reduce_scatter_v", DType::BF16, [](int, int n) { return total(n); }, [](int r, int) { return uneven(r); },
                [](Communicator& c, const void* in, void* out) {
                  c.reduce_scatter_v(in, out, uneven_counts(c.size()), DType::BF16, Reduce::Sum);
                }});
  cs.push_back({"all_gather", DType::F32, fixed(5), [](int, int n) { return 5 * n; },
                [](Communicator& c, const void* in, void* out) { c.all_gather(in, out, 5, DType::F32); }});
  cs.push_back({"all_gather_v", DType::F32, [](int r, int) { return uneven(r); }, [](int, int n) { return total(n); },
                [](Communicator& c, const void* in, void* out) {
                  c.all_gather_v(in, out, uneven_counts(c.size()), DType::F32);
                }});
  cs.push_back({"all_to_all", DType::F64, [](int, int n) { return 2 * n; }, [](int, int n) { return 2 * n; },
                [](Communicator& c, const void* in, void* out) { c.all_to_all(in, out, 2, DType::F64); }});
  cs.push_back({"all_to_all_v", DType::F32, [](int r, int n) { return sum(sends(r, n)); },
                [](int r, int n) { return sum(receives(r, n)); },
                [](Communicator& c, const void* in, void* out) {
                  c.all_to_all_v(in, sends(c.rank(), c.size()), out, receives(c.rank(), c.size()), DType::F32);
                }});
  cs.push_back(pieces_case());
  cs.push_back({"broadcast from the last rank", DType::F32, fixed(7), fixed(7), [](Communicator& c, const void* in, void* out) {
                  c.all_reduce(in, out, 7, DType::F32, Reduce::Max);
                  c.broadcast(out, 7, DType::F32, c.size() - 1);
                }});
  cs.push_back({"started all_gather_v", DType::F32, [](int r, int) { return uneven(r); }, [](int, int n) { return total(n); },
                [](Communicator& c, const void* in, void* out) {
                  c.start_all_gather_v(in, out, uneven_counts(c.size()), DType::F32)->wait();
                }});
  // A ring: the receive of rank r from r - 1 posted before its message (the copy straight into it),
  // then one whose message came first (queued in device memory).
  cs.push_back({"send and recv on a ring", DType::BF16, fixed(11), fixed(22), [](Communicator& c, const void* in, void* out) {
                  const int next = (c.rank() + 1) % c.size(), prev = (c.rank() + c.size() - 1) % c.size();
                  auto posted = c.start_recv(out, 11, DType::BF16, prev, 3);
                  c.barrier();
                  c.send(in, 11, DType::BF16, next, 3);
                  posted->wait();
                  c.send(in, 11, DType::BF16, next, 4);
                  c.barrier();
                  c.recv(static_cast<std::byte*>(out) + 11 * 2, 11, DType::BF16, prev, 4);
                }});
  return cs;
}

// This rank's output of `c` with host buffers, or with device buffers of `device` on a stream of
// its own.
inline Tensor run_case(Communicator& comm, const Case& c, Device device) {
  const int r = comm.rank(), n = comm.size();
  const Tensor in = input_of(c, r, n);
  Tensor result(c.dtype, Shape{c.out_count(r, n)});  // zeros: what a call leaves alone stays 0
  if (device.is_host()) {
    c.call(comm, in.raw(), result.raw());
    return result;
  }
  DeviceMemory& memory = device_memory(device);
  const Stream stream = memory.create_stream();
  const Tensor din = to_device(in, device, stream);
  Tensor dout = to_device(result, device, stream);
  {
    DeviceBuffers scope(device, stream);
    c.call(comm, din.device_ptr(), dout.device_ptr());
  }
  Tensor out = to_host(dout, stream);
  memory.destroy_stream(stream);
  return out;
}

}  // namespace shardwise::comm::device_cases
