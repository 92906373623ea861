#pragma once
// The raw launchers of the fused LM head's row kernels (lm_head.cu): rows of `cols` f32 logits of
// a vocab block holding the classes [offset, offset + cols); statistics per row in double; i64
// labels (global class ids). lm_head.h wraps them; launchers.h says why there are no tensors here.
#include <cstdint>

namespace shardwise::cuda::launch {

// row_max[i] = the max logit of row i in this block.
int lm_head_row_max(const float* logits, double* row_max, int64_t rows, int64_t cols, void* s);
// Given the GLOBAL row max: sum_exp[i] = sum of exp(logit - max) over this block, target[i] = the
// label's logit where this block holds it (0 elsewhere and on ignored rows).
int lm_head_row_sums(const float* logits, const int64_t* labels, const double* row_max, double* sum_exp,
                     double* target, int64_t rows, int64_t cols, int64_t offset, int64_t ignore_index, void* s);
// loss[i] = max + log(sum_exp) - target (0 on ignored rows); with `grads`, the logits become this
// block's dlogits (exp(logit - max) / sum_exp - onehot) * w, w = grad_scale (/ count[0] when
// `mean`), 0 on ignored rows.
int lm_head_row_finish(float* logits, const int64_t* labels, const double* row_max, const double* sum_exp,
                       const double* target, float* loss, int64_t rows, int64_t cols, int64_t offset,
                       int64_t ignore_index, bool grads, double grad_scale, bool mean, const double* count, void* s);

}  // namespace shardwise::cuda::launch
