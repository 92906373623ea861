#pragma once
// The MoE kernels' row movement (kernels.cc; bench/bench_moe.cc times it against raw
// MPI_Alltoallv): the kept rows packed in send order (by peer, then the peer's experts, then
// assignment), one all_to_all_pieces within the expert group that lands them expert-major (each
// local expert's rows from every source, in source order: where its GEMMs read them), and the
// inverse that returns the results in send order. The buffers are kept by the calling thread.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "shardwise/comm/communicator.h"
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

// The send buffer (kSendBuffer) of plan.order's rows of x [tokens, d] (assignment a is token a / top_k).
template <class T>
T* pack_rows(const DispatchPlan& plan, int64_t top_k, const T* x, int64_t d) {
  T* send = scratch<T>(kSendBuffer, plan.order.size() * static_cast<size_t>(d));
  for (size_t i = 0; i < plan.order.size(); ++i) {
    const T* src = x + (plan.order[i] / top_k) * d;
    std::copy(src, src + d, send + static_cast<int64_t>(i) * d);
  }
  return send;
}

// Dispatch (to_experts): the packed rows (`width` elements each) to the ranks owning their
// experts; returns this rank's experts' rows, expert-major (kExpertRows). Combine (!to_experts):
// the experts' results, expert-major, back to their senders; returns them in this rank's send
// order (kSendBuffer). One rank: `from` itself, whose two orders are the same.
template <class T>
T* exchange_rows(comm::Communicator* group, const DispatchPlan& plan, T* from, int64_t width, bool to_experts) {
  if (!group) return from;
  const int64_t rows = total_rows(to_experts ? plan.recv_rows : plan.send_rows);
  T* to = scratch<T>(to_experts ? kExpertRows : kSendBuffer, static_cast<size_t>(rows * width));
  const RowPieces senders = send_order(plan, width), experts = expert_major(plan, width);
  group->all_to_all_pieces(from, (to_experts ? senders : experts).view(), to, (to_experts ? experts : senders).view(),
                           dtype_v<T>);
  return to;
}

}  // namespace shardwise::ops::moe_detail
