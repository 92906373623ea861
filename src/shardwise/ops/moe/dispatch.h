#pragma once
// The MoE kernels' row movement (kernels.cc; bench/bench_moe.cc times it against raw
// MPI_Alltoallv): the kept rows packed in send order (by peer, then the peer's experts, then
// assignment) while the earlier peers' travel, one all_to_all_pieces within the expert group that
// lands them expert-major (each local expert's rows from every source, in source order: where its
// GEMMs read them), and the inverse that returns the results in send order. The buffers are kept
// by the calling thread; on a device (MoeShard::moves, moves.h) they are device memory of the call
// and the two exchanges device-buffer calls.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "shardwise/comm/communicator.h"
#include "shardwise/core/error.h"
#include "shardwise/ops/moe/moves.h"
#include "shardwise/ops/moe/routing.h"

namespace shardwise::ops::moe_detail {

// A buffer kept by the calling thread across calls and steps (grown when a call needs more, never
// value-initialised): no allocation, page faults or zero-fill per exchange. Two per element type:
// kSendBuffer holds the packed rows and then what the combine returns; kExpertRows the rows the
// local experts receive, which their results overwrite in place. (A forward or backward call
// uses them only until it returns; a thread keeps the largest call's two.)
enum ScratchSlot : int { kSendBuffer = 0, kExpertRows = 1 };
template <class T>
T* scratch(ScratchSlot slot, size_t n) {
  thread_local std::unique_ptr<T[]> buffer[2];
  thread_local size_t size[2] = {0, 0};
  if (n > size[slot]) {
    buffer[slot].reset();
    buffer[slot] = std::make_unique_for_overwrite<T[]>(n);
    size[slot] = n;
  }
  return buffer[slot].get();
}

// Pieces of rows of `width` elements (comm::Pieces' storage). The two ends of an exchange name
// the same pieces: one per (peer, expert of the receiving rank), empty ones included.
struct RowPieces {
  std::vector<int64_t> first{0}, offset, count;
  comm::Pieces view() const { return {first, offset, count}; }
  void add(int64_t row, int64_t rows, int64_t width) {
    offset.push_back(row * width);
    count.push_back(rows * width);
  }
  void end_peer() { first.push_back(static_cast<int64_t>(offset.size())); }
};

// The sender's rows in send order: peer by peer, each peer's experts in order, back to back.
inline RowPieces send_order(const DispatchPlan& plan, int64_t width) {
  RowPieces pieces;
  int64_t at = 0;
  for (size_t p = 0; p < static_cast<size_t>(plan.peers); ++p) {
    for (auto i = static_cast<size_t>(plan.send_first[p]); i < static_cast<size_t>(plan.send_first[p + 1]); ++i) {
      pieces.add(at, plan.send_expert_rows[i], width);
      at += plan.send_expert_rows[i];
    }
    pieces.end_peer();
  }
  return pieces;
}

// The rows this rank's experts receive, expert-major: peer p's rows for local expert j at expert
// j's start plus what earlier peers send j.
inline RowPieces expert_major(const DispatchPlan& plan, int64_t width) {
  const auto J = static_cast<size_t>(plan.local_experts);
  std::vector<int64_t> at(J, 0);
  for (size_t j = 1; j < J; ++j) at[j] = at[j - 1] + plan.expert_rows[j - 1];
  RowPieces pieces;
  for (size_t p = 0; p < static_cast<size_t>(plan.peers); ++p) {
    for (size_t j = 0; j < J; ++j) {
      const int64_t n = plan.rows_from[p * J + j];
      pieces.add(at[j], n, width);
      at[j] += n;
    }
    pieces.end_peer();
  }
  return pieces;
}

inline int64_t total_rows(const std::vector<int64_t>& rows) {
  int64_t s = 0;
  for (int64_t n : rows) s += n;
  return s;
}

// One call's row buffers on a device (MoeShard::moves): the packed rows (then the combine's
// results) and the experts' rows, held until the call has read its results.
struct DeviceRows {
  const MoeMoves& moves;
  std::unique_ptr<MoeMoves::Rows> send, experts, back;
  template <class T>
  static T* in(std::unique_ptr<MoeMoves::Rows>& held, const MoeMoves& moves, int64_t elements) {
    held = moves.rows(static_cast<size_t>(elements) * sizeof(T));
    return reinterpret_cast<T*>(held->data());
  }
};

// Dispatch: the kept rows, `width` elements each (write_row(i, dst) writes send-order row i, that
// is assignment plan.order[i], at dst), to the ranks owning their experts; returns this rank's
// experts' rows, expert-major (kExpertRows). Each peer's rows are packed into the send buffer
// (kSendBuffer) just before their messages leave, so packing the later peers overlaps the earlier
// ones' travel (all_to_all_pieces' fill); this rank's own rows travel as empty pieces and are
// written straight into place once every message has started. One rank: every row into place.
// Called after route()'s all_gather of the same op call, which the backends checked and which
// gave every rank every peer's counts: the exchanges agree by construction, so they skip the call
// checks (CheckedByCaller; MPI still checks each received piece's size). So does the combine.
// On a device (`device`): the buffers its memory, every peer's rows packed before one exchange of
// the same pieces on device buffers (the rows written, in the same order, before the copies read them).
template <class T, class WriteRow>
T* dispatch_rows(comm::Communicator* group, const DispatchPlan& plan, int64_t width, WriteRow write_row,
                 DeviceRows* device = nullptr) {
  const auto sent = static_cast<int64_t>(plan.order.size()) * width, got = total_rows(plan.recv_rows) * width;
  T* send = device ? DeviceRows::in<T>(device->send, device->moves, sent) : scratch<T>(kSendBuffer, static_cast<size_t>(sent));
  T* to = device ? DeviceRows::in<T>(device->experts, device->moves, got) : scratch<T>(kExpertRows, static_cast<size_t>(got));
  RowPieces senders = send_order(plan, width), experts = expert_major(plan, width);
  const auto me = static_cast<size_t>(group ? group->rank() : 0);
  auto fill = [&](int peer) {
    const auto p = static_cast<size_t>(peer);
    for (auto i = static_cast<size_t>(senders.first[p]), j = static_cast<size_t>(experts.first[p]);
         i < static_cast<size_t>(senders.first[p + 1]); ++i, ++j) {
      const int64_t row = senders.offset[i] / width, rows = plan.send_expert_rows[i];  // (the counts of me's pieces are 0)
      T* dst = p == me ? to + experts.offset[j] : send + senders.offset[i];
      for (int64_t q = 0; q < rows; ++q) write_row(row + q, dst + q * width);
    }
  };
  if (!group) {
    fill(0);
    return to;
  }
  for (auto i = static_cast<size_t>(senders.first[me]); i < static_cast<size_t>(senders.first[me + 1]); ++i) senders.count[i] = 0;
  for (auto j = static_cast<size_t>(experts.first[me]); j < static_cast<size_t>(experts.first[me + 1]); ++j) experts.count[j] = 0;
  comm::CheckedByCaller checked(group);
  if (device) {
    for (int p = 0; p < group->size(); ++p) fill(p);
    device->moves.exchange(*group, send, senders.view(), to, experts.view(), dtype_v<T>);
    return to;
  }
  group->all_to_all_pieces(send, senders.view(), to, experts.view(), dtype_v<T>, fill);
  return to;
}

// Combine: the experts' results (`width` elements a row), expert-major, back to their senders;
// returns them in this rank's send order (kSendBuffer). One rank: `from` itself, whose two
// orders are the same.
template <class T>
T* combine_rows(comm::Communicator* group, const DispatchPlan& plan, T* from, int64_t width,
                DeviceRows* device = nullptr) {
  if (!group) return from;
  const auto back = static_cast<int64_t>(plan.order.size()) * width;
  T* to = device ? DeviceRows::in<T>(device->back, device->moves, back) : scratch<T>(kSendBuffer, static_cast<size_t>(back));
  const RowPieces senders = send_order(plan, width), experts = expert_major(plan, width);
  comm::CheckedByCaller checked(group);
  if (device) device->moves.exchange(*group, from, experts.view(), to, senders.view(), dtype_v<T>);
  else group->all_to_all_pieces(from, experts.view(), to, senders.view(), dtype_v<T>);
  return to;
}

// One call's dispatch and combine over the expert group, by messages (dispatch_rows and
// combine_rows) or through the group's shared regions (MoeExchange). Shared: each region holds two
// halves, one a call (by SharedRegions::call), each the expert-major rows of its rank's experts,
// `width_in` elements a row in, `width_out` out (the experts write their results over their rows,
// packed from the start). dispatch(): every rank writes its kept rows at plan.send_at in their
// peers' regions (peers in ring order from the next rank, so that the ranks spread over the
// regions), then a shared_barrier (the two: one Communicator::shared_exchange, which --profile
// records as an all_to_all of the bytes the message path's call counts); the experts compute in
// place in this rank's region. combine(): a shared_exchange with no writes, that is a
// shared_barrier (every expert's results written), then returns where each result lies: the
// caller reads it there, no copy. The next call writes the other half; the barrier after its writes orders them
// after this call's reads (no third barrier). One rank or messages: the rows of the scratch
// buffers, as before.
template <class T>
class RowExchange {
 public:
  // moves: the rows' buffers and exchanges on a device (messages only; null: the host's).
  RowExchange(comm::Communicator* group, const DispatchPlan& plan, MoeExchange exchange, int64_t width_in,
              int64_t width_out, const MoeMoves* moves = nullptr)
      : group_(group), plan_(plan), width_in_(width_in), width_out_(width_out) {
    for (int64_t n : plan.send_expert_rows) piece_row_.push_back(piece_row_.back() + n);
    const MoeExchange wanted = group_ ? exchange_wanted(exchange) : MoeExchange::Messages;
    if (moves && group_) {
      SW_CHECK(wanted != MoeExchange::Shared,
               "moe_mlp: the shared-memory exchange was asked for (MoeExchange::Shared or SHARDWISE_MOE_EXCHANGE=shared), "
               "but the rows are device memory: on a device they move by all_to_all_v on device buffers (unset it, "
               "or set it to messages)");
      device_.emplace(DeviceRows{*moves, {}, {}, {}});
      return;
    }
    if (wanted == MoeExchange::Messages) return;
    int64_t rows = 0;
    for (int64_t n : plan.peer_rows) rows = std::max(rows, n);
    const int64_t half = comm::region_round_up(rows * std::max(width_in, width_out) * static_cast<int64_t>(sizeof(T)));
    const comm::SharedRegions shared = group_->shared_regions(2 * half);
    if (!shared) {
      SW_CHECK(wanted == MoeExchange::Auto,
               "moe_mlp: the shared-memory exchange was asked for (MoeExchange::Shared or "
               "SHARDWISE_MOE_EXCHANGE=shared), but the expert group [{}] ({} backend) has no shared regions (a "
               "member on another node, or a backend without them)",
               fmt::join(group_->members(), ","), group_->backend());
      return;
    }
    const int64_t at = shared.call % 2 * (shared.bytes / 2 / comm::kRegionAlign * comm::kRegionAlign);
    for (std::byte* region : shared.at) regions_.push_back(reinterpret_cast<T*>(region + at));
  }
  bool shared() const { return !regions_.empty(); }

  // The rows of this rank's experts, expert-major (write_row(i, dst): send-order row i at dst).
  template <class WriteRow>
  T* dispatch(WriteRow write_row) {
    if (!shared()) return from_ = dispatch_rows<T>(group_, plan_, width_in_, write_row, device_ ? &*device_ : nullptr);
    const int me = group_->rank();
    // The bytes dispatch_rows' all_to_all_pieces counts: the rows for the other ranks (this
    // rank's own go straight into place on both paths).
    int64_t sent = 0;
    for (int p = 0; p < plan_.peers; ++p) sent += p == me ? 0 : plan_.send_rows[static_cast<size_t>(p)];
    group_->shared_exchange(sent * width_in_ * static_cast<int64_t>(sizeof(T)), [&](int peer) {
      const auto p = static_cast<size_t>(peer);
      for (auto i = static_cast<size_t>(plan_.send_first[p]); i < static_cast<size_t>(plan_.send_first[p + 1]); ++i) {
        T* dst = regions_[p] + plan_.send_at[i] * width_in_;
        const int64_t first = piece_row_[i];
        for (int64_t q = 0; q < plan_.send_expert_rows[i]; ++q) write_row(first + q, dst + q * width_in_);
      }
    });
    return regions_[static_cast<size_t>(me)];
  }

  // After the experts wrote their results (`width_out` a row) over the rows dispatch() returned:
  // where send-order row i's result lies, for every i.
  std::vector<const T*> combine() {
    std::vector<const T*> at(plan_.order.size());
    if (!shared()) {
      const T* back = combine_rows<T>(group_, plan_, from_, width_out_, device_ ? &*device_ : nullptr);
      for (size_t i = 0; i < at.size(); ++i) at[i] = back + static_cast<int64_t>(i) * width_out_;
      return at;
    }
    // The bytes combine_rows' all_to_all_pieces counts: every result of this rank's experts.
    group_->shared_exchange(total_rows(plan_.recv_rows) * width_out_ * static_cast<int64_t>(sizeof(T)));
    for (size_t p = 0; p < static_cast<size_t>(plan_.peers); ++p) {
      for (auto i = static_cast<size_t>(plan_.send_first[p]); i < static_cast<size_t>(plan_.send_first[p + 1]); ++i) {
        const int64_t first = piece_row_[i];
        for (int64_t q = 0; q < plan_.send_expert_rows[i]; ++q) {
          at[static_cast<size_t>(first + q)] = regions_[p] + (plan_.send_at[i] + q) * width_out_;
        }
      }
    }
    return at;
  }

 private:
  comm::Communicator* group_;
  const DispatchPlan& plan_;
  int64_t width_in_, width_out_;
  std::vector<T*> regions_;  // this call's half of every member's region
  std::vector<int64_t> piece_row_{0};  // send piece i's first row in send order
  T* from_ = nullptr;  // messages: the experts' rows
  std::optional<DeviceRows> device_;  // on a device: the call's buffers
};

}  // namespace shardwise::ops::moe_detail
