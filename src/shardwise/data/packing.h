#pragma once
// Documents packed into fixed-length windows (`train --no-cross-document-attention`). A sample is
// a window of the token stream as always; with an end-of-text id the window is cut into documents:
// a document ends with its eos token (the eos belongs to the document it ends; the next token
// starts a new one). Each token then attends only to the tokens of its own document at or before
// it, and its position id counts from its document's first token, so a window holding two
// documents computes what each document would compute alone (tests/data/test_packing.cc).
#include <cstdint>

#include "shardwise/tensor/tensor.h"

namespace shardwise::train {

struct DocumentInputs {
  Tensor position_ids;    // [B, S] i64: each token's index within its document
  Tensor attention_mask;  // [B, 1, S, S] f32, additive: 0 where key u <= query t lies in t's document, -1e9 elsewhere
  Tensor document_ids;    // [B, S] i64: each token's document, counted from 0 in its row (fused attention)
};
// From the input ids [B, S] of a micro-batch. Error when ids is not [B, S] i64 or eos_id < 0.
// `mask` false leaves attention_mask undefined (fused attention reads the document ids instead).
DocumentInputs document_inputs(const Tensor& ids, int64_t eos_id, bool mask = true);

}  // namespace shardwise::train
