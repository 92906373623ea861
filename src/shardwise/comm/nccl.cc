#include "shardwise/comm/nccl.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <tuple>

#include "shardwise/comm/call_check.h"
#include "shardwise/comm/device_buffers.h"
#include "shardwise/core/error.h"

namespace shardwise::comm {
namespace {

void check_cuda(cudaError_t code, const char* call) {
  if (code != cudaSuccess) fail("{} failed: {} ({})", call, cudaGetErrorString(code), static_cast<int>(code));
}

void check_nccl(ncclResult_t code, const char* call, ncclComm_t comm = nullptr) {
  if (code == ncclSuccess) return;
  const char* detail = comm ? ncclGetLastError(comm) : "";
  fail("{} failed: {} ({}){}{}", call, ncclGetErrorString(code), static_cast<int>(code), *detail ? ": " : "", detail);
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::F16: return ncclFloat16;
    case DType::BF16: return ncclBfloat16;
    case DType::I64: return ncclInt64;
    case DType::I32: return ncclInt32;
    case DType::I8: return ncclInt8;
    case DType::U8:
    case DType::Bool: return ncclUint8;
    case DType::U16: return ncclFloat16;  // storage-only: moved as 2-byte words, never reduced
    case DType::U32: return ncclUint32;
    case DType::U64: return ncclUint64;
  }
  fail("nccl: unknown dtype code {}", static_cast<int>(dtype));
}

ncclRedOp_t nccl_op(DType dtype, Reduce op) {
  check_computable(dtype, "nccl: a reduction");
  if (dtype == DType::Bool) return op == Reduce::Prod || op == Reduce::Min ? ncclMin : ncclMax;  // and / or
  switch (op) {
    case Reduce::Sum: return ncclSum;
    case Reduce::Avg: return ncclAvg;
    case Reduce::Max: return ncclMax;
    case Reduce::Min: return ncclMin;
    case Reduce::Prod: return ncclProd;
  }
  return ncclSum;
}

size_t bytes_of(int64_t count, DType dtype) { return static_cast<size_t>(count) * dtype_size(dtype); }

const std::byte* at(const void* base, int64_t count, DType dtype) {
  return base ? static_cast<const std::byte*>(base) + bytes_of(count, dtype) : nullptr;
}
std::byte* at(void* base, int64_t count, DType dtype) {
  return base ? static_cast<std::byte*>(base) + bytes_of(count, dtype) : nullptr;
}

}  // namespace

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
}

struct NcclComm::State {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int device = 0;

  // Runs `enqueue` (NCCL calls on `stream`) inside one NCCL group and waits for the stream; under a
  // DeviceBuffers scope (comm/device_buffers.h), `stream` is the caller's for the call, and the
  // call returns once its work is queued there.
  template <class Enqueue>
  void run(const char* what, Enqueue enqueue) {
    const DeviceBuffers* caller = DeviceBuffers::current();
    const cudaStream_t own = stream;
    if (caller) {
      SW_CHECK(caller->device == Device::cuda(device), "nccl: {}: device buffers of {} on the communicator of cuda:{}",
               what, caller->device.to_string(), device);
      stream = static_cast<cudaStream_t>(caller->stream.handle);
    }
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    try {
      enqueue();
    } catch (...) {
      (void)ncclGroupEnd();
      stream = own;
      throw;
    }
    stream = own;
    check_nccl(ncclGroupEnd(), what, comm);
    if (!caller) check_cuda(cudaStreamSynchronize(stream), what);
  }
};

NcclComm::NcclComm(std::shared_ptr<Communicator> host, int device)
    : host_(std::move(host)), device_(device), checks_(call_checks_default()), state_(std::make_unique<State>()) {
  int devices = cuda_device_count();
  SW_CHECK(devices > 0, "nccl: no CUDA device is visible to rank {}", host_->rank());
  if (device_ < 0) device_ = host_->rank() % devices;
  SW_CHECK(device_ < devices, "nccl: device {} does not exist (this process sees {} devices)", device_, devices);
  state_->device = device_;
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  ncclUniqueId id{};
  if (host_->rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  {
    HostBuffers host;
    host_->broadcast(&id, static_cast<int64_t>(sizeof id), DType::U8, 0);
  }
  check_nccl(ncclCommInitRank(&state_->comm, host_->size(), id, host_->rank()), "ncclCommInitRank");
  check_cuda(cudaStreamCreateWithFlags(&state_->stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
}

NcclComm::NcclComm(std::shared_ptr<Communicator> host, int device, std::unique_ptr<State> state)
    : host_(std::move(host)), device_(device), checks_(call_checks_default()), state_(std::move(state)) {}

NcclComm::~NcclComm() {
  if (!state_) return;
  cudaSetDevice(device_);
  if (state_->stream) cudaStreamDestroy(state_->stream);
  if (state_->comm) ncclCommDestroy(state_->comm);
}

void NcclComm::check_call(const CallSignature& call, std::span<const int64_t> counts,
                          std::span<const int64_t> a2a_send, std::span<const int64_t> a2a_recv) {
  SW_CHECK(call.count >= 0, "{}: negative count {}", collective_name(call.op), call.count);
  if (!checks_ || CheckedByCaller::active(this)) return;
  CheckExchange exchange{
      [this](const void* mine, void* all, size_t bytes) {
        HostBuffers host;  // (host signatures, whatever the caller's buffers)
        host_->all_gather(mine, all, static_cast<int64_t>(bytes), DType::U8);
      },
      [this](const int64_t* send, int64_t* recv) {
        HostBuffers host;
        host_->all_to_all(send, recv, 1, DType::I64);
      }};
  comm::check_call(exchange, call, members(), counts, a2a_send, a2a_recv);
}

std::shared_ptr<Communicator> NcclComm::group(std::span<const int> global_ranks) {
  group_index(global_ranks);
  return std::make_shared<NcclComm>(host_->group(global_ranks), device_);
}

std::shared_ptr<NcclComm> NcclComm::split(int color, int key) {
  // The host communicator of the new group: every rank learns every rank's (color, key).
  int64_t mine[2] = {color, key};
  std::vector<int64_t> all(static_cast<size_t>(2 * size()));
  HostBuffers host;
  host_->all_gather(mine, all.data(), 2, DType::I64);
  std::vector<std::tuple<int64_t, int, int>> order;  // (key, rank, global rank) of my color
  for (int r = 0; r < size(); ++r) {
    if (color >= 0 && all[static_cast<size_t>(2 * r)] == color) {
      order.emplace_back(all[static_cast<size_t>(2 * r + 1)], r, members()[static_cast<size_t>(r)]);
    }
  }
  std::sort(order.begin(), order.end());
  auto state = std::make_unique<State>();
  state->device = device_;
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  check_nccl(ncclCommSplit(state_->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &state->comm, nullptr),
             "ncclCommSplit", state_->comm);
  if (color < 0) return nullptr;
  check_cuda(cudaStreamCreateWithFlags(&state->stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  std::vector<int> members;
  for (auto& [k, r, global] : order) members.push_back(global);
  return std::shared_ptr<NcclComm>(new NcclComm(host_->group(members), device_, std::move(state)));
}

void NcclComm::all_reduce(const void* in, void* out, int64_t count, DType dtype, Reduce op) {
  check_call(signature(Collective::AllReduce, count, dtype, op));
  state_->run("ncclAllReduce", [&] {
    check_nccl(ncclAllReduce(in, out, static_cast<size_t>(count), nccl_type(dtype), nccl_op(dtype, op), state_->comm,
                             state_->stream),
               "ncclAllReduce", state_->comm);
  });
}

void NcclComm::reduce(const void* in, void* out, int64_t count, DType dtype, Reduce op, int root) {
  check_root("reduce", root);
  check_call(signature(Collective::Reduce, count, dtype, op, root));
  state_->run("ncclReduce", [&] {
    check_nccl(ncclReduce(in, out, static_cast<size_t>(count), nccl_type(dtype), nccl_op(dtype, op), root,
                          state_->comm, state_->stream),
               "ncclReduce", state_->comm);
  });
}

void NcclComm::broadcast(void* buffer, int64_t count, DType dtype, int root) {
  check_root("broadcast", root);
  check_call(signature(Collective::Broadcast, count, dtype, Reduce::Sum, root));
  state_->run("ncclBroadcast", [&] {
    check_nccl(ncclBroadcast(buffer, buffer, static_cast<size_t>(count), nccl_type(dtype), root, state_->comm,
                             state_->stream),
               "ncclBroadcast", state_->comm);
  });
}

void NcclComm::all_gather(const void* in, void* out, int64_t count, DType dtype) {
  check_call(signature(Collective::AllGather, count, dtype));
  state_->run("ncclAllGather", [&] {
    check_nccl(ncclAllGather(in, out, static_cast<size_t>(count), nccl_type(dtype), state_->comm, state_->stream),
               "ncclAllGather", state_->comm);
  });
}

void NcclComm::all_gather_v(const void* in, void* out, std::span<const int64_t> counts, DType dtype) {
  check_counts("all_gather_v", counts);
  CallSignature call = signature(Collective::AllGatherV, counts[static_cast<size_t>(rank())], dtype);
  call.same_count = 0;
  call.counts_hash = hash_counts(counts);
  check_call(call, counts);
  state_->run("all_gather_v (ncclBroadcast)", [&] {
    int64_t first = 0;
    for (int r = 0; r < size(); ++r) {
      int64_t c = counts[static_cast<size_t>(r)];
      void* dst = at(out, first, dtype);
      if (c) {
        check_nccl(ncclBroadcast(r == rank() ? in : dst, dst, static_cast<size_t>(c), nccl_type(dtype), r, state_->comm,
                                 state_->stream),
                   "ncclBroadcast", state_->comm);
      }
      first += c;
    }
  });
}

void NcclComm::reduce_scatter(const void* in, void* out, int64_t count, DType dtype, Reduce op) {
  check_call(signature(Collective::ReduceScatter, count, dtype, op));
  state_->run("ncclReduceScatter", [&] {
    check_nccl(ncclReduceScatter(in, out, static_cast<size_t>(count), nccl_type(dtype), nccl_op(dtype, op),
                                 state_->comm, state_->stream),
               "ncclReduceScatter", state_->comm);
  });
}

void NcclComm::reduce_scatter_v(const void* in, void* out, std::span<const int64_t> counts, DType dtype, Reduce op) {
  check_counts("reduce_scatter_v", counts);
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  CallSignature call = signature(Collective::ReduceScatterV, total, dtype, op);
  call.counts_hash = hash_counts(counts);
  check_call(call, counts);
  state_->run("reduce_scatter_v (ncclReduce)", [&] {
    int64_t first = 0;
    for (int r = 0; r < size(); ++r) {
      int64_t c = counts[static_cast<size_t>(r)];
      if (c) {
        check_nccl(ncclReduce(at(in, first, dtype), out, static_cast<size_t>(c), nccl_type(dtype), nccl_op(dtype, op),
                              r, state_->comm, state_->stream),
                   "ncclReduce", state_->comm);
      }
      first += c;
    }
  });
}

void NcclComm::all_to_all(const void* in, void* out, int64_t count, DType dtype) {
  check_call(signature(Collective::AllToAll, count, dtype));
  if (count == 0) return;
  state_->run("all_to_all (ncclSend/ncclRecv)", [&] {
    for (int p = 0; p < size(); ++p) {
      check_nccl(ncclSend(at(in, count * p, dtype), static_cast<size_t>(count), nccl_type(dtype), p, state_->comm,
                          state_->stream),
                 "ncclSend", state_->comm);
      check_nccl(ncclRecv(at(out, count * p, dtype), static_cast<size_t>(count), nccl_type(dtype), p, state_->comm,
                          state_->stream),
                 "ncclRecv", state_->comm);
    }
  });
}

void NcclComm::all_to_all_v(const void* in, std::span<const int64_t> send_counts, void* out,
                            std::span<const int64_t> recv_counts, DType dtype) {
  check_counts("all_to_all_v (send counts)", send_counts);
  check_counts("all_to_all_v (receive counts)", recv_counts);
  check_call(signature(Collective::AllToAllV, 0, dtype), {}, send_counts, recv_counts);
  state_->run("all_to_all_v (ncclSend/ncclRecv)", [&] {
    int64_t sent = 0, received = 0;
    for (int p = 0; p < size(); ++p) {
      auto s = send_counts[static_cast<size_t>(p)], r = recv_counts[static_cast<size_t>(p)];
      if (s) {
        check_nccl(ncclSend(at(in, sent, dtype), static_cast<size_t>(s), nccl_type(dtype), p, state_->comm, state_->stream),
                   "ncclSend", state_->comm);
      }
      if (r) {
        check_nccl(ncclRecv(at(out, received, dtype), static_cast<size_t>(r), nccl_type(dtype), p, state_->comm,
                            state_->stream),
                   "ncclRecv", state_->comm);
      }
      sent += s, received += r;
    }
  });
}

void NcclComm::send(const void* in, int64_t count, DType dtype, int peer, int tag) {
  check_peer("send", peer);
  SW_CHECK(count >= 0, "send: negative count {}", count);
  if (checks_) {
    int64_t header = static_cast<int64_t>(bytes_of(count, dtype));
    HostBuffers host;
    host_->send(&header, 1, DType::I64, peer, tag);
  }
  if (count == 0) return;
  state_->run("ncclSend", [&] {
    check_nccl(ncclSend(in, static_cast<size_t>(count), nccl_type(dtype), peer, state_->comm, state_->stream),
               "ncclSend", state_->comm);
  });
}

void NcclComm::recv(void* out, int64_t count, DType dtype, int peer, int tag) {
  check_peer("recv", peer);
  SW_CHECK(count >= 0, "recv: negative count {}", count);
  auto want = static_cast<int64_t>(bytes_of(count, dtype));
  int64_t got = want;
  if (checks_) {
    HostBuffers host;
    host_->recv(&got, 1, DType::I64, peer, tag);
  }
  if (got != want && got == 0) {
    fail_recv_size(members()[static_cast<size_t>(rank())], count, dtype, want, members()[static_cast<size_t>(peer)], tag, 0);
  }
  if (got != want) {
    // Receive the message anyway (the sender waits for it), then report both sizes.
    void* sink = nullptr;
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    check_cuda(cudaMalloc(&sink, static_cast<size_t>(got)), "cudaMalloc");
    try {
      state_->run("ncclRecv", [&] {
        check_nccl(ncclRecv(sink, static_cast<size_t>(got), ncclUint8, peer, state_->comm, state_->stream), "ncclRecv",
                   state_->comm);
      });
    } catch (...) {
      cudaFree(sink);
      throw;
    }
    cudaFree(sink);
    fail_recv_size(members()[static_cast<size_t>(rank())], count, dtype, want, members()[static_cast<size_t>(peer)], tag,
                   got);
  }
  if (count == 0) return;
  state_->run("ncclRecv", [&] {
    check_nccl(ncclRecv(out, static_cast<size_t>(count), nccl_type(dtype), peer, state_->comm, state_->stream),
               "ncclRecv", state_->comm);
  });
}

void NcclComm::barrier() {
  check_call(signature(Collective::Barrier, 0, DType::U8));
  // Every NCCL call here has completed before it returned (under a DeviceBuffers scope: once the
  // caller's stream has run): the host barrier is the GPU barrier.
  if (const DeviceBuffers* d = DeviceBuffers::current()) {
    check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(d->stream.handle)), "cudaStreamSynchronize");
  }
  HostBuffers host;
  host_->barrier();
}

}  // namespace shardwise::comm
