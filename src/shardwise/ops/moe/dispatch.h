#pragma once
// The MoE kernels' row movement (kernels.cc; bench/bench_moe.cc times it against raw
// MPI_Alltoallv): one all_to_all_v of whole rows within the expert group, and the regrouping of
// what arrives (by source, then local expert) to expert-major order and back.
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "shardwise/comm/communicator.h"
#include "shardwise/ops/moe/routing.h"

namespace shardwise::ops::moe_detail {

// Sends rows of `width` elements, `send_rows[p]` to peer p (packed in peer order); returns what
// arrives. One rank: the buffer itself.
template <class T>
std::vector<T> exchange(comm::Communicator* group, const std::vector<T>& send, const std::vector<int64_t>& send_rows,
                        const std::vector<int64_t>& recv_rows, int64_t width) {
  if (!group) return send;
  std::vector<int64_t> sc(send_rows.size()), rc(recv_rows.size());
  int64_t total = 0;
  for (size_t p = 0; p < sc.size(); ++p) {
    sc[p] = send_rows[p] * width;
    rc[p] = recv_rows[p] * width;
    total += rc[p];
  }
  std::vector<T> out(static_cast<size_t>(total));
  group->all_to_all_v(send.data(), sc, out.data(), rc, dtype_v<T>);
  return out;
}

// Received rows are grouped by source, then local expert; the experts want them by expert, then
// source. to_expert_major moves them there, the inverse back (rows of `width`); with one peer or
// one local expert both orders are the same and the rows come back as they are (no copy).
template <class T>
std::vector<T> regroup(const DispatchPlan& plan, std::vector<T> rows, int64_t width, bool to_expert_major) {
  const int64_t P = plan.peers, J = plan.local_experts;
  if (P == 1 || J <= 1) return rows;  // one source or one local expert: the orders are the same
  std::vector<int64_t> expert_start(static_cast<size_t>(J), 0);
  for (int64_t j = 1; j < J; ++j) {
    expert_start[static_cast<size_t>(j)] = expert_start[static_cast<size_t>(j - 1)] + plan.expert_rows[static_cast<size_t>(j - 1)];
  }
  std::vector<T> out(rows.size());
  int64_t src = 0;
  std::vector<int64_t> filled(static_cast<size_t>(J), 0);
  for (int64_t p = 0; p < P; ++p) {
    for (int64_t j = 0; j < J; ++j) {
      const int64_t n = plan.rows_from[static_cast<size_t>(p * J + j)];
      const int64_t dst = expert_start[static_cast<size_t>(j)] + filled[static_cast<size_t>(j)];
      filled[static_cast<size_t>(j)] += n;
      const T* from = rows.data() + (to_expert_major ? src : dst) * width;
      T* to = out.data() + (to_expert_major ? dst : src) * width;
      std::copy(from, from + n * width, to);
      src += n;
    }
  }
  return out;
}

}  // namespace shardwise::ops::moe_detail
