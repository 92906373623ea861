#pragma once
// Context parallelism (a cp mesh dim) in the trainer: what it composes with, and the sequences
// reordered into cp's balanced order (mesh/cp_order.h) on their way into the graph and back.
//
// The model graphs see every sequence in the balanced order (GptConfig::cp_order): the loader reads
// the natural rows, bind_rows reorders the columns of ids, labels and packed documents' ids and
// positions, and a contiguous S(1) split over cp then gives rank i chunks i and 2cp-1-i. The loss
// is a sum over tokens, so the order does not change it; greedy predictions come back reordered.
#include <cstdint>
#include <span>

#include "shardwise/mesh/strategy.h"
#include "shardwise/models/gpt.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::train {

// Error naming the first thing a cp mesh does not compose with yet (a Python model, a sequence
// that does not cut into 2 cp chunks, packed documents with the unfused attention's
// [B, 1, S, S] mask); nothing without cp. `packed`: packed documents.
void check_context_parallel(const mesh::Strategy& s, const GptConfig& model, bool packed);

// rows [R, S] with its columns in cp's order: out[:, x] = rows[:, order[x]] (order:
// mesh::cp_balanced_order(S, ranks)); `from_cp_order` undoes it. ranks 1: the tensor itself.
Tensor to_cp_order(const Tensor& rows, int64_t ranks);
Tensor from_cp_order(const Tensor& rows, int64_t ranks);

}  // namespace shardwise::train
