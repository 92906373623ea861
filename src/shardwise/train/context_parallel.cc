#include "shardwise/train/context_parallel.h"

#include <cstring>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/mesh/cp_order.h"
#include "shardwise/models/custom.h"

namespace shardwise::train {
namespace {

// out[:, to[x]] = rows[:, from[x]] for every column x.
Tensor move_columns(const Tensor& rows, int64_t ranks, bool forward) {
  if (ranks <= 1) return rows;
  SW_CHECK(rows.shape().ndim() == 2, "cp's order: rows must be [R, S], got {}", rows.shape().to_string());
  const int64_t R = rows.shape()[0], S = rows.shape()[1];
  const std::vector<int64_t> order = mesh::cp_balanced_order(S, ranks);
  Tensor out(rows.dtype(), rows.shape());
  const size_t es = dtype_size(rows.dtype());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t x = 0; x < S; ++x) {
      const int64_t stored = r * S + x, natural = r * S + order[static_cast<size_t>(x)];
      std::memcpy(out.raw() + (forward ? stored : natural) * static_cast<int64_t>(es),
                  rows.raw() + (forward ? natural : stored) * static_cast<int64_t>(es), es);
    }
  return out;
}

}  // namespace

void check_context_parallel(const mesh::Strategy& s, const GptConfig& model, bool packed) {
  if (s.cp < 0) return;
  const int64_t cp = s.cp_size();
  SW_CHECK(model.custom == nullptr || model.custom->feeds.empty(),
           "context parallelism (cp) does not compose with a Python model fed batches of its own yet (only token "
           "ids are put in cp's order): train it without a cp dim");
  SW_CHECK(cp == 1 || model.seq % (2 * cp) == 0,
           "--seq {} does not split over cp={}: context parallelism's balanced order cuts each sequence into 2 x cp = "
           "{} equal chunks (make --seq a multiple of {})",
           model.seq, cp, 2 * cp, 2 * cp);
  SW_CHECK(!packed || model.fused_attention(),
           "context parallelism (cp) with packed documents (--no-cross-document-attention) needs --attention fused: "
           "the unfused attention's per-sequence [S, S] mask is not put in cp's order");
}

Tensor to_cp_order(const Tensor& rows, int64_t ranks) { return move_columns(rows, ranks, true); }
Tensor from_cp_order(const Tensor& rows, int64_t ranks) { return move_columns(rows, ranks, false); }

}  // namespace shardwise::train
