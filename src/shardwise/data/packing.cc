#include "shardwise/data/packing.h"

#include "shardwise/core/error.h"

namespace shardwise::train {

DocumentInputs document_inputs(const Tensor& ids, int64_t eos_id, bool with_mask) {
  SW_CHECK(ids.dtype() == DType::I64 && ids.shape().ndim() == 2, "document inputs need ids [B, S] i64, got {} {}",
           dtype_name(ids.dtype()), ids.shape().to_string());
  SW_CHECK(eos_id >= 0, "document boundaries need an end-of-text id, got {}", eos_id);
  const int64_t B = ids.shape()[0], S = ids.shape()[1];
  DocumentInputs out{Tensor(DType::I64, Shape{B, S}),
                     with_mask ? Tensor::full(DType::F32, Shape{B, 1, S, S}, -1e9) : Tensor(),
                     Tensor(DType::I64, Shape{B, S})};
  const int64_t* in = ids.data<int64_t>();
  int64_t* pos = out.position_ids.data<int64_t>();
  int64_t* doc = out.document_ids.data<int64_t>();
  float* mask = with_mask ? out.attention_mask.data<float>() : nullptr;
  for (int64_t b = 0; b < B; ++b) {
    int64_t start = 0, index = 0;  // the first position and the number of the current document
    for (int64_t t = 0; t < S; ++t) {
      pos[b * S + t] = t - start;
      doc[b * S + t] = index;
      if (mask != nullptr) {
        float* row = mask + (b * S + t) * S;
        for (int64_t u = start; u <= t; ++u) row[u] = 0.0f;
      }
      if (in[b * S + t] == eos_id) start = t + 1, ++index;  // the eos ends its document
    }
  }
  return out;
}

}  // namespace shardwise::train
