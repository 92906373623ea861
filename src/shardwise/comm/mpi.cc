#include "shardwise/comm/mpi.h"

#include <array>
#include <climits>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <optional>
#include <mutex>

#include "shardwise/comm/call_check.h"
#include "shardwise/comm/device_staging.h"
#include "shardwise/comm/reduce_kernels.h"
#include "shardwise/core/error.h"

namespace shardwise::comm {

// (mpi_world.cc uses it too.)
void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) length = 0;
  fail("{} failed: {} (MPI error code {})", call, std::string_view(text, static_cast<size_t>(length)), code);
}

namespace {

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::F16:
    case DType::BF16: return MPI_UINT16_T;  // moved as bits; reduced by the user ops below
    case DType::I64: return MPI_INT64_T;
    case DType::I32: return MPI_INT32_T;
    case DType::I8: return MPI_INT8_T;
    case DType::U8: return MPI_UINT8_T;
    case DType::Bool: return MPI_C_BOOL;
    case DType::U16: return MPI_UINT16_T;  // storage-only: moved, never reduced (SW_DISPATCH refuses)
    case DType::U32: return MPI_UINT32_T;
    case DType::U64: return MPI_UINT64_T;
  }
  fail("mpi: unknown dtype code {}", static_cast<int>(dtype));
}

// reduce_buffers as an MPI_Op: inout = in (op) inout. Commutative to the bit (reduce_kernels.h).
template <DType D, Reduce R>
void user_reduce(void* in, void* inout, int* len, MPI_Datatype*) noexcept {
  const void* inputs[2] = {in, inout};
  reduce_buffers(inputs, inout, *len, D, R);
}

constexpr DType kUserTypes[] = {DType::F32, DType::F64, DType::F16, DType::BF16};
constexpr Reduce kUserOps[] = {Reduce::Sum, Reduce::Prod, Reduce::Max, Reduce::Min};

template <DType D>
void create_ops(MPI_Op* ops) {
  check_mpi(MPI_Op_create(&user_reduce<D, Reduce::Sum>, 1, &ops[0]), "MPI_Op_create");
  check_mpi(MPI_Op_create(&user_reduce<D, Reduce::Prod>, 1, &ops[1]), "MPI_Op_create");
  check_mpi(MPI_Op_create(&user_reduce<D, Reduce::Max>, 1, &ops[2]), "MPI_Op_create");
  check_mpi(MPI_Op_create(&user_reduce<D, Reduce::Min>, 1, &ops[3]), "MPI_Op_create");
}

MPI_Op user_op(DType dtype, Reduce op) {
  static std::array<MPI_Op, 16> ops;
  static std::once_flag once;
  std::call_once(once, [] {
    create_ops<DType::F32>(&ops[0]);
    create_ops<DType::F64>(&ops[4]);
    create_ops<DType::F16>(&ops[8]);
    create_ops<DType::BF16>(&ops[12]);
  });
  size_t t = 0, o = 0;
  while (kUserTypes[t] != dtype) ++t;
  Reduce base = op == Reduce::Avg ? Reduce::Sum : op;
  while (kUserOps[o] != base) ++o;
  return ops[t * 4 + o];
}

MPI_Op mpi_op(DType dtype, Reduce op) {
  if (dtype == DType::Bool) {  // as in the local backend: sum/avg/max = or, prod/min = and
    return op == Reduce::Prod || op == Reduce::Min ? MPI_LAND : MPI_LOR;
  }
  bool half = dtype == DType::F16 || dtype == DType::BF16;
  // MPI's float max/min neither propagate NaN nor order signed zeros alike on every rank.
  if (half || (is_floating(dtype) && (op == Reduce::Max || op == Reduce::Min))) return user_op(dtype, op);
  switch (op) {
    case Reduce::Sum:
    case Reduce::Avg: return MPI_SUM;
    case Reduce::Prod: return MPI_PROD;
    case Reduce::Max: return MPI_MAX;
    case Reduce::Min: return MPI_MIN;
  }
  return MPI_SUM;
}

// Avg = sum, then divide in the compute type (integers truncate), as reduce_kernels does.
void divide_by(void* data, int64_t count, DType dtype, int n) {
  SW_DISPATCH(dtype, [&] {
    if constexpr (!std::is_same_v<T, bool>) {
      using C = compute_t<T>;
      T* p = static_cast<T*>(data);
      for (int64_t i = 0; i < count; ++i) p[i] = static_cast<T>(static_cast<C>(p[i]) / static_cast<C>(n));
    }
  });
}

// `count` elements of `dtype` as (MPI type, int count): the base type when count fits in
// max_count, else one element of a derived type that spans the whole block.
class Block {
 public:
  Block(int64_t count, DType dtype, int64_t max_count) : type_(mpi_type(dtype)) {
    if (count <= max_count) {
      count_ = static_cast<int>(count);
      return;
    }
    int64_t chunks = count / max_count, rest = count % max_count;
    SW_CHECK(chunks <= INT_MAX, "mpi: {} elements of {} are beyond what one message can describe", count,
             dtype_name(dtype));
    auto size = static_cast<MPI_Aint>(dtype_size(dtype));
    MPI_Datatype chunk, joined;
    check_mpi(MPI_Type_contiguous(static_cast<int>(max_count), type_, &chunk), "MPI_Type_contiguous");
    int lengths[2] = {static_cast<int>(chunks), static_cast<int>(rest)};
    MPI_Aint offsets[2] = {0, static_cast<MPI_Aint>(chunks * max_count) * size};
    MPI_Datatype types[2] = {chunk, type_};
    check_mpi(MPI_Type_create_struct(rest ? 2 : 1, lengths, offsets, types, &joined), "MPI_Type_create_struct");
    // The extent is exactly the block, so that consecutive blocks (all_gather, all_to_all) abut.
    check_mpi(MPI_Type_create_resized(joined, 0, static_cast<MPI_Aint>(count) * size, &type_),
              "MPI_Type_create_resized");
    check_mpi(MPI_Type_commit(&type_), "MPI_Type_commit");
    MPI_Type_free(&chunk);
    MPI_Type_free(&joined);
    owned_ = true;
    count_ = 1;
  }
  ~Block() {
    if (owned_) MPI_Type_free(&type_);
  }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
  MPI_Datatype type() const { return type_; }
  int count() const { return count_; }

 private:
  MPI_Datatype type_;
  int count_ = 0;
  bool owned_ = false;
};

std::byte* at(void* base, int64_t elements, DType dtype) {
  return base ? static_cast<std::byte*>(base) + elements * static_cast<int64_t>(dtype_size(dtype)) : nullptr;
}
const std::byte* at(const void* base, int64_t elements, DType dtype) {
  return base ? static_cast<const std::byte*>(base) + elements * static_cast<int64_t>(dtype_size(dtype)) : nullptr;
}

int64_t total_of(std::span<const int64_t> counts) {
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  return total;
}

// Counts and displacements as MPI's ints (the caller checked that the total fits).
void to_ints(std::span<const int64_t> counts, std::vector<int>& ints, std::vector<int>& displacements) {
  int64_t at = 0;
  for (int64_t c : counts) {
    ints.push_back(static_cast<int>(c));
    displacements.push_back(static_cast<int>(at));
    at += c;
  }
}

}  // namespace

MpiComm::MpiComm(MPI_Comm comm, std::vector<int> members)
    : comm_(comm), members_(std::move(members)), checks_(call_checks_default()), max_count_(INT_MAX) {
  check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  int size = 0;
  check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm_, &size), "MPI_Comm_size");
  SW_CHECK(size == static_cast<int>(members_.size()), "mpi: a communicator of {} ranks given {} member ids", size,
           members_.size());
  int* tag_ub = nullptr;
  int found = 0;
  check_mpi(MPI_Comm_get_attr(comm_, MPI_TAG_UB, &tag_ub, &found), "MPI_Comm_get_attr");
  internal_tag_ = found && tag_ub ? *tag_ub : 32767;
}

MpiComm::~MpiComm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  try {
    free_shared();
  } catch (const Error&) {  // a destructor does not throw; the window is MPI's to clean up then
  }
  if (comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF) MPI_Comm_free(&comm_);
}

SharedRegions MpiComm::shared_regions(int64_t bytes) {
  SW_CHECK(bytes >= 0, "shared_regions: negative size {}", bytes);
  if (on_one_node_ < 0) {
    MPI_Comm node = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
    int node_size = 0;
    const int code = MPI_Comm_size(node, &node_size);
    MPI_Comm_free(&node);
    check_mpi(code, "MPI_Comm_size");
    int all = node_size == size() ? 1 : 0;
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, comm_), "MPI_Allreduce");
    on_one_node_ = all;
  }
  if (!on_one_node_) return {};
  if (window_ == MPI_WIN_NULL || bytes > region_bytes_) {
    const int64_t grown = grown_region_bytes(bytes, region_bytes_);
    if (window_ != MPI_WIN_NULL) shared_barrier();  // every member is done with the old regions
    free_shared();
    MPI_Info info;
    check_mpi(MPI_Info_create(&info), "MPI_Info_create");
    MPI_Info_set(info, "alloc_shared_noncontig", "true");  // each region on its owner's memory
    void* mine = nullptr;
    const int code = MPI_Win_allocate_shared(static_cast<MPI_Aint>(grown + kRegionAlign), 1, info, comm_, &mine, &window_);
    MPI_Info_free(&info);
    check_mpi(code, "MPI_Win_allocate_shared");
    check_mpi(MPI_Win_set_errhandler(window_, MPI_ERRORS_RETURN), "MPI_Win_set_errhandler");
    regions_.assign(members_.size(), nullptr);
    for (size_t r = 0; r < members_.size(); ++r) {
      MPI_Aint size = 0;
      int unit = 0;
      void* at = nullptr;
      check_mpi(MPI_Win_shared_query(window_, static_cast<int>(r), &size, &unit, &at), "MPI_Win_shared_query");
      SW_CHECK(size >= grown + kRegionAlign, "shared_regions: rank {}'s region has {} bytes, not the {} asked",
               members_[r], static_cast<int64_t>(size), grown + kRegionAlign);
      regions_[r] = aligned_region(static_cast<std::byte*>(at));  // (Open MPI's are 8-byte aligned)
    }
    check_mpi(MPI_Win_lock_all(MPI_MODE_NOCHECK, window_), "MPI_Win_lock_all");
    region_bytes_ = grown;
  }
  return {regions_, region_bytes_, region_calls_++};
}

void MpiComm::shared_barrier() {
  SW_CHECK(window_ != MPI_WIN_NULL, "shared_barrier: no shared regions on this group (call shared_regions first)");
  check_mpi(MPI_Win_sync(window_), "MPI_Win_sync");
  check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
  check_mpi(MPI_Win_sync(window_), "MPI_Win_sync");
}

void MpiComm::free_shared() {
  if (window_ == MPI_WIN_NULL) return;
  regions_.clear();
  region_bytes_ = 0;
  check_mpi(MPI_Win_unlock_all(window_), "MPI_Win_unlock_all");
  check_mpi(MPI_Win_free(&window_), "MPI_Win_free");
}

std::shared_ptr<MpiComm> MpiComm::dup() const {
  MPI_Comm copy = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(comm_, &copy), "MPI_Comm_dup");
  auto out = std::make_shared<MpiComm>(copy, members_);
  out->checks_ = checks_;
  out->max_count_ = max_count_;
  return out;
}

void MpiComm::set_max_count(int64_t max_count) {
  SW_CHECK(max_count >= 1 && max_count <= INT_MAX, "mpi: max count {} is outside 1 .. {}", max_count, INT_MAX);
  max_count_ = max_count;
}

void MpiComm::check_call(const CallSignature& call, std::span<const int64_t> counts,
                         std::span<const int64_t> a2a_send, std::span<const int64_t> a2a_recv) {
  SW_CHECK(call.count >= 0, "{}: negative count {}", collective_name(call.op), call.count);
  if (!checks_ || CheckedByCaller::active(this)) return;
  CheckExchange exchange{
      [this](const void* mine, void* all, size_t bytes) {
        check_mpi(MPI_Allgather(mine, static_cast<int>(bytes), MPI_BYTE, all, static_cast<int>(bytes), MPI_BYTE, comm_),
                  "MPI_Allgather");
      },
      [this](const int64_t* send, int64_t* recv) {
        check_mpi(MPI_Alltoall(send, 1, MPI_INT64_T, recv, 1, MPI_INT64_T, comm_), "MPI_Alltoall");
      }};
  comm::check_call(exchange, call, members_, counts, a2a_send, a2a_recv);
}

std::shared_ptr<Communicator> MpiComm::group(std::span<const int> global_ranks) {
  group_index(global_ranks);
  std::vector<int> local_ranks;
  for (int g : global_ranks) {
    local_ranks.push_back(static_cast<int>(std::find(members_.begin(), members_.end(), g) - members_.begin()));
  }
  MPI_Group parent, sub;
  check_mpi(MPI_Comm_group(comm_, &parent), "MPI_Comm_group");
  check_mpi(MPI_Group_incl(parent, static_cast<int>(local_ranks.size()), local_ranks.data(), &sub), "MPI_Group_incl");
  MPI_Comm created = MPI_COMM_NULL;
  int code = MPI_Comm_create_group(comm_, sub, 0, &created);
  MPI_Group_free(&sub);
  MPI_Group_free(&parent);
  check_mpi(code, "MPI_Comm_create_group");
  auto child = std::make_shared<MpiComm>(created, std::vector<int>(global_ranks.begin(), global_ranks.end()));
  child->checks_ = checks_;
  child->max_count_ = max_count_;
  return child;
}

// Reduction in chunks of at most max_count_ elements, to every rank (root < 0) or to root.
void MpiComm::reduce_chunks(const void* in, void* out, int64_t count, DType dtype, Reduce op, int root) {
  MPI_Datatype type = mpi_type(dtype);
  MPI_Op mop = mpi_op(dtype, op);
  bool in_place = in == out;
  for (int64_t first = 0; first < count; first += max_count_) {
    int n = static_cast<int>(std::min(max_count_, count - first));
    const void* src = at(in, first, dtype);
    if (root < 0) {
      check_mpi(MPI_Allreduce(in_place ? MPI_IN_PLACE : src, at(out, first, dtype), n, type, mop, comm_),
                "MPI_Allreduce");
    } else if (rank_ == root) {
      check_mpi(MPI_Reduce(in_place ? MPI_IN_PLACE : src, at(out, first, dtype), n, type, mop, root, comm_),
                "MPI_Reduce");
    } else {
      check_mpi(MPI_Reduce(src, nullptr, n, type, mop, root, comm_), "MPI_Reduce");
    }
  }
}

void MpiComm::all_reduce(const void* in, void* out, int64_t count, DType dtype, Reduce op) {
  if (const DeviceBuffers* d = DeviceBuffers::current()) [[unlikely]] return staged::all_reduce(*this, *d, in, out, count, dtype, op);
  check_call(signature(Collective::AllReduce, count, dtype, op));
  reduce_chunks(in, out, count, dtype, op, -1);
  if (op == Reduce::Avg) divide_by(out, count, dtype, size());
}

namespace {

// A started MPI collective; Avg divides after completion.
class MpiRequest final : public Request {
 public:
  MpiRequest(MPI_Request request, void* out, int64_t count, DType dtype, int divide_by)
      : request_(request), out_(out), count_(count), dtype_(dtype), divide_(divide_by) {}
  void start(MPI_Request request) { request_ = request; }
  ~MpiRequest() override {
    if (request_ != MPI_REQUEST_NULL) MPI_Wait(&request_, MPI_STATUS_IGNORE);  // unwinding: the buffers must outlive it
  }
  void wait() override {
    if (request_ == MPI_REQUEST_NULL) return;
    check_mpi(MPI_Wait(&request_, MPI_STATUS_IGNORE), "MPI_Wait");
    done();
  }
  bool test() override {
    if (request_ == MPI_REQUEST_NULL) return true;
    int flag = 0;
    check_mpi(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    if (flag) done();
    return flag != 0;
  }

 private:
  void done() {
    request_ = MPI_REQUEST_NULL;
    if (divide_ > 1) divide_by(out_, count_, dtype_, divide_);
  }
  MPI_Request request_;
 public:
  std::vector<int> arrays;  // count arrays the call reads until it completes (not to change before)

 private:
  void* out_;
  int64_t count_;
  DType dtype_;
  int divide_;
};

// A started send or receive (MPI_Isend / MPI_Irecv). A receive checks the message's size when done
// (an Error naming both sizes; a larger one is MPI's truncation); one never waited for (a step
// unwinding from an error) is cancelled, a send waited for.
class PointRequest final : public Request {
 public:
  struct Receive { int receiver, sender, tag; int64_t count; DType dtype; };  // NOLINT: plain record
  explicit PointRequest(std::optional<Receive> receive) : receive_(receive) {}
  MPI_Request* handle() { return &request_; }
  ~PointRequest() override {
    if (done_ || request_ == MPI_REQUEST_NULL) return;
    if (receive_) MPI_Cancel(&request_);
    MPI_Wait(&request_, MPI_STATUS_IGNORE);
  }
  void wait() override {
    if (!done_) finish(request_ == MPI_REQUEST_NULL ? MPI_SUCCESS : MPI_Wait(&request_, &status_));
  }
  bool test() override {
    int flag = 0;
    if (done_) return true;
    const int code = MPI_Test(&request_, &flag, &status_);
    if (flag || code != MPI_SUCCESS) finish(code);
    return done_;
  }

 private:
  void finish(int code) {
    done_ = true;
    request_ = MPI_REQUEST_NULL;
    if (receive_) {
      const Receive& r = *receive_;
      const int64_t want = r.count * static_cast<int64_t>(dtype_size(r.dtype));
      int error_class = code;
      if (code != MPI_SUCCESS) MPI_Error_class(code, &error_class);
      SW_CHECK(error_class != MPI_ERR_TRUNCATE, "recv: rank {} expects {} elements of {} ({} bytes) from rank {} (tag {}), "
               "but the message is larger", r.receiver, r.count, dtype_name(r.dtype), want, r.sender, r.tag);
      MPI_Count got = want;
      if (code == MPI_SUCCESS) check_mpi(MPI_Get_elements_x(&status_, MPI_BYTE, &got), "MPI_Get_elements_x");
      if (got != want) fail_recv_size(r.receiver, r.count, r.dtype, want, r.sender, r.tag, static_cast<int64_t>(got));
    }
    check_mpi(code, "MPI_Wait");
  }
  MPI_Request request_ = MPI_REQUEST_NULL;
  MPI_Status status_{};
  bool done_ = false;
  std::optional<Receive> receive_;
};

}  // namespace

std::unique_ptr<Request> MpiComm::start_all_reduce(const void* in, void* out, int64_t count, DType dtype, Reduce op) {
  if (const DeviceBuffers* d = DeviceBuffers::current()) [[unlikely]] return staged::all_reduce(*this, *d, in, out, count, dtype, op), std::make_unique<DoneRequest>();
  check_call(signature(Collective::StartAllReduce, count, dtype, op));
  if (count > max_count_) {  // every rank takes this branch alike (the same count)
    reduce_chunks(in, out, count, dtype, op, -1);
    if (op == Reduce::Avg) divide_by(out, count, dtype, size());
    return std::make_unique<DoneRequest>();
  }
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallreduce(in == out ? MPI_IN_PLACE : in, out, static_cast<int>(count), mpi_type(dtype),
                           mpi_op(dtype, op), comm_, &request),
            "MPI_Iallreduce");
  return std::make_unique<MpiRequest>(request, out, count, dtype, op == Reduce::Avg ? size() : 1);
}

std::unique_ptr<Request> MpiComm::start_reduce_scatter_v(const void* in, void* out, std::span<const int64_t> counts,
                                                         DType dtype, Reduce op) {
  if (const DeviceBuffers* d = DeviceBuffers::current()) [[unlikely]] return staged::reduce_scatter_v(*this, *d, in, out, counts, dtype, op), std::make_unique<DoneRequest>();
  check_counts("start_reduce_scatter_v", counts);
  const int64_t total = total_of(counts), mine = counts[static_cast<size_t>(rank_)];
  CallSignature call = signature(Collective::StartReduceScatterV, total, dtype, op);
  call.counts_hash = hash_counts(counts);
  check_call(call, counts);
  if (total > max_count_) {
    int64_t first = 0;
    for (int r = 0; r < size(); ++r) {
      int64_t c = counts[static_cast<size_t>(r)];
      reduce_chunks(at(in, first, dtype), r == rank_ ? out : nullptr, c, dtype, op, r);
      first += c;
    }
    if (op == Reduce::Avg) divide_by(out, mine, dtype, size());
    return std::make_unique<DoneRequest>();
  }
  std::vector<int> ints, displacements;
  to_ints(counts, ints, displacements);
  MPI_Request request = MPI_REQUEST_NULL;
  // The counts array must not change before completion (MPI-3.1 5.12): the request keeps it.
  auto started = std::make_unique<MpiRequest>(MPI_REQUEST_NULL, out, mine, dtype, op == Reduce::Avg ? size() : 1);
  started->arrays = std::move(ints);
  check_mpi(MPI_Ireduce_scatter(in, out, started->arrays.data(), mpi_type(dtype), mpi_op(dtype, op), comm_, &request),
            "MPI_Ireduce_scatter");
  started->start(request);
  return started;
}

std::unique_ptr<Request> MpiComm::start_all_gather_v(const void* in, void* out, std::span<const int64_t> counts,
                                                     DType dtype) {
  if (const DeviceBuffers* d = DeviceBuffers::current()) [[unlikely]] return staged::all_gather_v(*this, *d, in, out, counts, dtype), std::make_unique<DoneRequest>();
  check_counts("start_all_gather_v", counts);
  CallSignature call = signature(Collective::StartAllGatherV, counts[static_cast<size_t>(rank_)], dtype);
  call.same_count = 0;
  call.counts_hash = hash_counts(counts);
  check_call(call, counts);
  if (total_of(counts) > max_count_) {  // every rank alike (the same counts): the blocking path (checked again)
    all_gather_v(in, out, counts, dtype);
    return std::make_unique<DoneRequest>();
  }
  std::vector<int> ints, displacements;
  to_ints(counts, ints, displacements);
  const size_t n = ints.size();
  // The count and displacement arrays must not change before completion: the request keeps them.
  auto started = std::make_unique<MpiRequest>(MPI_REQUEST_NULL, out, 0, dtype, 1);
  started->arrays = std::move(ints);
  started->arrays.insert(started->arrays.end(), displacements.begin(), displacements.end());
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallgatherv(in, started->arrays[static_cast<size_t>(rank_)], mpi_type(dtype), out, started->arrays.data(),
                            started->arrays.data() + n, mpi_type(dtype), comm_, &request),
            "MPI_Iallgatherv");
  started->start(request);
  return started;
}

void MpiComm::reduce(const void* in, void* out, int64_t count, DType dtype, Reduce op, int root) {
  if (const DeviceBuffers* d = DeviceBuffers::current()) [[unlikely]] return staged::reduce(*this, *d, in, out, count, dtype, op, root);
  check_root("reduce", root);
  check_call(signature(Collective::Reduce, count, dtype, op, root));
  reduce_chunks(in, out, count, dtype, op, root);
  if (op == Reduce::Avg && rank_ == root) divide_by(out, count, dtype, size());
}

void MpiComm::broadcast(void* buffer, int64_t count, DType dtype, int root) {
  if (const DeviceBuffers* d = DeviceBuffers::current()) [[unlikely]] return staged::broadcast(*this, *d, buffer, count, dtype, root);
  check_root("broadcast", root);
  check_call(signature(Collective::Broadcast, count, dtype, Reduce::Sum, root));
  Block block(count, dtype, max_count_);
  check_mpi(MPI_Bcast(buffer, block.count(), block.type(), root, comm_), "MPI_Bcast");
}

void MpiComm::all_gather(const void* in, void* out, int64_t count, DType dtype) {
  if (const DeviceBuffers* d = DeviceBuffers::current()) [[unlikely]] return staged::all_gather(*this, *d, in, out, count, dtype);
  check_call(signature(Collective::AllGather, count, dtype));
  Block block(count, dtype, max_count_);
  check_mpi(MPI_Allgather(in, block.count(), block.type(), out, block.count(), block.type(), comm_), "MPI_Allgather");
}

void MpiComm::all_gather_v(const void* in, void* out, std::span<const int64_t> counts, DType dtype) {
  if (const DeviceBuffers* d = DeviceBuffers::current()) [[unlikely]] return staged::all_gather_v(*this, *d, in, out, counts, dtype);
  check_counts("all_gather_v", counts);
  CallSignature call = signature(Collective::AllGatherV, counts[static_cast<size_t>(rank_)], dtype);
  call.same_count = 0;
  call.counts_hash = hash_counts(counts);
  check_call(call, counts);
  if (total_of(counts) <= max_count_) {
    std::vector<int> ints, displacements;
    to_ints(counts, ints, displacements);
    check_mpi(MPI_Allgatherv(in, ints[static_cast<size_t>(rank_)], mpi_type(dtype), out, ints.data(),
                             displacements.data(), mpi_type(dtype), comm_),
              "MPI_Allgatherv");
    return;
  }
  // Displacements beyond int: one broadcast per rank, straight into place.
  int64_t first = 0;
  for (int r = 0; r < size(); ++r) {
    int64_t c = counts[static_cast<size_t>(r)];
    std::byte* dst = at(out, first, dtype);
    if (r == rank_ && c) std::memcpy(dst, in, static_cast<size_t>(c) * dtype_size(dtype));
    Block block(c, dtype, max_count_);
    check_mpi(MPI_Bcast(dst, block.count(), block.type(), r, comm_), "MPI_Bcast");
    first += c;
  }
}

void MpiComm::reduce_scatter(const void* in, void* out, int64_t count, DType dtype, Reduce op) {
  if (const DeviceBuffers* d = DeviceBuffers::current()) [[unlikely]] return staged::reduce_scatter(*this, *d, in, out, count, dtype, op);
  check_call(signature(Collective::ReduceScatter, count, dtype, op));
  if (count * size() <= max_count_) {
    check_mpi(MPI_Reduce_scatter_block(in, out, static_cast<int>(count), mpi_type(dtype), mpi_op(dtype, op), comm_),
              "MPI_Reduce_scatter_block");
  } else {
    for (int r = 0; r < size(); ++r) reduce_chunks(at(in, count * r, dtype), r == rank_ ? out : nullptr, count, dtype, op, r);
  }
  if (op == Reduce::Avg) divide_by(out, count, dtype, size());
}

void MpiComm::reduce_scatter_v(const void* in, void* out, std::span<const int64_t> counts, DType dtype, Reduce op) {
  if (const DeviceBuffers* d = DeviceBuffers::current()) [[unlikely]] return staged::reduce_scatter_v(*this, *d, in, out, counts, dtype, op);
  check_counts("reduce_scatter_v", counts);
  int64_t total = total_of(counts);
  CallSignature call = signature(Collective::ReduceScatterV, total, dtype, op);
  call.counts_hash = hash_counts(counts);
  check_call(call, counts);
  if (total <= max_count_) {
    std::vector<int> ints, displacements;
    to_ints(counts, ints, displacements);
    check_mpi(MPI_Reduce_scatter(in, out, ints.data(), mpi_type(dtype), mpi_op(dtype, op), comm_), "MPI_Reduce_scatter");
  } else {
    int64_t first = 0;
    for (int r = 0; r < size(); ++r) {
      int64_t c = counts[static_cast<size_t>(r)];
      reduce_chunks(at(in, first, dtype), r == rank_ ? out : nullptr, c, dtype, op, r);
      first += c;
    }
  }
  if (op == Reduce::Avg) divide_by(out, counts[static_cast<size_t>(rank_)], dtype, size());
}

void MpiComm::all_to_all(const void* in, void* out, int64_t count, DType dtype) {
  if (const DeviceBuffers* d = DeviceBuffers::current()) [[unlikely]] return staged::all_to_all(*this, *d, in, out, count, dtype);
  check_call(signature(Collective::AllToAll, count, dtype));
  Block block(count, dtype, max_count_);
  check_mpi(MPI_Alltoall(in, block.count(), block.type(), out, block.count(), block.type(), comm_), "MPI_Alltoall");
}

void MpiComm::all_to_all_v(const void* in, std::span<const int64_t> send_counts, void* out,
                           std::span<const int64_t> recv_counts, DType dtype) {
  if (const DeviceBuffers* d = DeviceBuffers::current()) [[unlikely]] return staged::all_to_all_v(*this, *d, in, send_counts, out, recv_counts, dtype);
  check_counts("all_to_all_v (send counts)", send_counts);
  check_counts("all_to_all_v (receive counts)", recv_counts);
  check_call(signature(Collective::AllToAllV, 0, dtype), {}, send_counts, recv_counts);
  // Whether some rank's counts leave the int range is known only to that rank: agree on the path.
  int large = total_of(send_counts) > max_count_ || total_of(recv_counts) > max_count_;
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &large, 1, MPI_INT, MPI_MAX, comm_), "MPI_Allreduce");
  if (!large) {
    std::vector<int> sc, sd, rc, rd;
    to_ints(send_counts, sc, sd);
    to_ints(recv_counts, rc, rd);
    check_mpi(MPI_Alltoallv(in, sc.data(), sd.data(), mpi_type(dtype), out, rc.data(), rd.data(), mpi_type(dtype), comm_),
              "MPI_Alltoallv");
    return;
  }
  // Pairwise exchange with whole-block datatypes, on the reserved tag.
  std::vector<int64_t> send_first(send_counts.size()), recv_first(recv_counts.size());
  for (size_t p = 1; p < send_counts.size(); ++p) {
    send_first[p] = send_first[p - 1] + send_counts[p - 1];
    recv_first[p] = recv_first[p - 1] + recv_counts[p - 1];
  }
  for (int step = 0; step < size(); ++step) {
    auto to = static_cast<size_t>((rank_ + step) % size()), from = static_cast<size_t>((rank_ - step + size()) % size());
    Block sent(send_counts[to], dtype, max_count_), received(recv_counts[from], dtype, max_count_);
    check_mpi(MPI_Sendrecv(at(in, send_first[to], dtype), sent.count(), sent.type(), static_cast<int>(to), internal_tag_,
                           at(out, recv_first[from], dtype), received.count(), received.type(), static_cast<int>(from),
                           internal_tag_, comm_, MPI_STATUS_IGNORE),
              "MPI_Sendrecv");
  }
}

void MpiComm::all_to_all_pieces(const void* in, const Pieces& send, void* out, const Pieces& recv, DType dtype,
                                const FillPieces& fill) {
  if (const DeviceBuffers* d = DeviceBuffers::current()) [[unlikely]] return staged::all_to_all_pieces(*this, *d, in, send, out, recv, dtype, fill);
  const std::vector<int64_t> send_counts = check_pieces("all_to_all_pieces (send)", send);
  const std::vector<int64_t> recv_counts = check_pieces("all_to_all_pieces (receive)", recv);
  check_call(signature(Collective::AllToAllPieces, 0, dtype), {}, send_counts, recv_counts);
  const auto me = static_cast<size_t>(rank_);
  const int64_t mine = send.first[me + 1] - send.first[me];
  SW_CHECK(recv.first[me + 1] - recv.first[me] == mine, "all_to_all_pieces: rank {} sends itself {} pieces but receives {}",
           members_[me], mine, recv.first[me + 1] - recv.first[me]);
  for (int64_t i = 0; i < mine; ++i) {
    const auto s = static_cast<size_t>(send.first[me] + i), r = static_cast<size_t>(recv.first[me] + i);
    SW_CHECK(send.count[s] == recv.count[r], "all_to_all_pieces: rank {} sends itself a piece of {} elements into one of {}",
             members_[me], send.count[s], recv.count[r]);
  }
  // Receives first, then each peer's fill and sends, every non-empty piece its own message on the
  // reserved tag (MPI keeps the order of messages between two ranks on one tag, so the i-th send
  // meets the i-th receive).
  std::vector<MPI_Request> requests;
  std::vector<std::unique_ptr<Block>> blocks;
  std::vector<std::pair<size_t, int>> receives;  // (piece, peer) of each receive request
  auto start = [&](const Pieces& pieces, size_t p, bool receive) {
    for (auto i = static_cast<size_t>(pieces.first[p]); i < static_cast<size_t>(pieces.first[p + 1]); ++i) {
      if (!pieces.count[i]) continue;
      blocks.push_back(std::make_unique<Block>(pieces.count[i], dtype, max_count_));
      requests.emplace_back();
      const int peer = static_cast<int>(p);
      if (receive) {
        receives.emplace_back(i, peer);
        check_mpi(MPI_Irecv(at(out, pieces.offset[i], dtype), blocks.back()->count(), blocks.back()->type(), peer,
                            internal_tag_, comm_, &requests.back()),
                  "MPI_Irecv");
      } else {
        check_mpi(MPI_Isend(at(in, pieces.offset[i], dtype), blocks.back()->count(), blocks.back()->type(), peer,
                            internal_tag_, comm_, &requests.back()),
                  "MPI_Isend");
      }
    }
  };
  for (size_t p = 0; p < members_.size(); ++p) {
    if (p != me) start(recv, p, true);
  }
  for (size_t step = 1; step < members_.size(); ++step) {  // peers after this rank first, as a ring
    const size_t p = (me + step) % members_.size();
    if (fill) fill(static_cast<int>(p));
    start(send, p, false);
  }
  if (fill) fill(rank_);
  for (int64_t i = 0; i < mine; ++i) {
    const auto s = static_cast<size_t>(send.first[me] + i), r = static_cast<size_t>(recv.first[me] + i);
    if (send.count[s]) {
      std::memcpy(at(out, recv.offset[r], dtype), at(in, send.offset[s], dtype),
                  static_cast<size_t>(send.count[s]) * dtype_size(dtype));
    }
  }
  std::vector<MPI_Status> statuses(requests.size());
  check_mpi(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), statuses.data()), "MPI_Waitall");
  for (size_t k = 0; k < receives.size(); ++k) {
    MPI_Count got = 0;
    check_mpi(MPI_Get_elements_x(&statuses[k], MPI_BYTE, &got), "MPI_Get_elements_x");
    const auto want = static_cast<MPI_Count>(recv.count[receives[k].first] * static_cast<int64_t>(dtype_size(dtype)));
    SW_CHECK(got == want, "all_to_all_pieces: rank {} received a piece of {} bytes from rank {} into one of {} bytes",
             members_[me], got, members_[static_cast<size_t>(receives[k].second)], want);
  }
}

void MpiComm::check_point(const char* op, int64_t count, int peer, int tag) const {
  check_peer(op, peer);
  SW_CHECK(count >= 0, "{}: negative count {}", op, count);
  SW_CHECK(tag >= 0 && tag < internal_tag_, "{}: tag {} is outside 0 .. {}", op, tag, internal_tag_ - 1);
}

void MpiComm::send(const void* in, int64_t count, DType dtype, int peer, int tag) {
  if (const DeviceBuffers* d = DeviceBuffers::current()) [[unlikely]] return staged::send(*this, *d, in, count, dtype, peer, tag);
  check_point("send", count, peer, tag);
  Block block(count, dtype, max_count_);
  check_mpi(MPI_Send(in, block.count(), block.type(), peer, tag, comm_), "MPI_Send");
}

void MpiComm::recv(void* out, int64_t count, DType dtype, int peer, int tag) {
  if (const DeviceBuffers* d = DeviceBuffers::current()) [[unlikely]] return staged::recv(*this, *d, out, count, dtype, peer, tag);
  check_point("recv", count, peer, tag);
  MPI_Status status;
  check_mpi(MPI_Probe(peer, tag, comm_, &status), "MPI_Probe");
  MPI_Count got = 0;
  check_mpi(MPI_Get_elements_x(&status, MPI_BYTE, &got), "MPI_Get_elements_x");
  auto want = static_cast<MPI_Count>(count) * static_cast<MPI_Count>(dtype_size(dtype));
  if (got != want) {
    // Take the message off the channel (as the local backend does), then report both sizes.
    std::vector<std::byte> discard(static_cast<size_t>(got));
    Block block(got, DType::U8, max_count_);
    check_mpi(MPI_Recv(discard.data(), block.count(), block.type(), peer, tag, comm_, MPI_STATUS_IGNORE), "MPI_Recv");
    fail_recv_size(members_[static_cast<size_t>(rank_)], count, dtype, want, members_[static_cast<size_t>(peer)], tag, got);
  }
  Block block(count, dtype, max_count_);
  check_mpi(MPI_Recv(out, block.count(), block.type(), peer, tag, comm_, MPI_STATUS_IGNORE), "MPI_Recv");
}

std::unique_ptr<Request> MpiComm::start_send(const void* in, int64_t count, DType dtype, int peer, int tag) {
  if (DeviceBuffers::current()) [[unlikely]] return Communicator::start_send(in, count, dtype, peer, tag);  // staged at its wait
  check_point("send", count, peer, tag);
  auto request = std::make_unique<PointRequest>(std::nullopt);
  Block block(count, dtype, max_count_);  // (a derived type may be freed once the send has started)
  check_mpi(MPI_Isend(in, block.count(), block.type(), peer, tag, comm_, request->handle()), "MPI_Isend");
  return request;
}

std::unique_ptr<Request> MpiComm::start_recv(void* out, int64_t count, DType dtype, int peer, int tag) {
  if (DeviceBuffers::current()) [[unlikely]] return Communicator::start_recv(out, count, dtype, peer, tag);  // staged at its wait
  check_point("recv", count, peer, tag);
  auto request = std::make_unique<PointRequest>(PointRequest::Receive{
      members_[static_cast<size_t>(rank_)], members_[static_cast<size_t>(peer)], tag, count, dtype});
  Block block(count, dtype, max_count_);
  check_mpi(MPI_Irecv(out, block.count(), block.type(), peer, tag, comm_, request->handle()), "MPI_Irecv");
  return request;
}

void MpiComm::barrier() {
  check_call(signature(Collective::Barrier, 0, DType::U8));
  check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
}

}  // namespace shardwise::comm
