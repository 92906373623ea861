#pragma once
// The raw launchers of the CUDA kernels (*.cu): device pointers, sizes and a stream (a
// cudaStream_t, as Stream::handle holds it), no tensors, so the .cu files need nothing but the CUDA
// runtime and C++17 (CMake 3.25 gives nvcc no C++20). Each returns the launch's cudaError_t (as int).
// kernels.h wraps them for device tensors; its comments say what each computes.
#include <cstddef>
#include <cstdint>

#include "shardwise/cuda/common/tensor_launchers.h"

namespace shardwise::cuda::launch {

enum class Activation : uint8_t { Gelu, Silu };
int activation_forward(Activation op, const float* x, float* y, int64_t n, void* s);
int activation_backward(Activation op, const float* x, const float* dy, float* dx, int64_t n, void* s);

struct AdamWScalars {
  float beta1, beta2, step_size, inv_bc2_sqrt, eps, decay;
};
// param_bf16 (nullable): gets the updated w rounded to bf16 (the kernels' copy of an f32 master).
int adamw(float* w, float* m, float* v, const float* g, void* param_bf16, int64_t n, AdamWScalars c, void* s);

// Rows of `cols` values; statistics (f32) are one per row, parameters one per column. x, the
// parameters, out and the gradients are of the element type `t` (f32 or bf16).
int layer_norm_forward(Elem t, const void* x, const void* scale, const void* bias, void* out, float* mean,
                       float* rstd, int64_t rows, int64_t cols, double eps, void* s);
int layer_norm_backward(Elem t, const void* x, const void* scale, const float* mean, const float* rstd,
                        const void* dout, void* dx, void* dscale, void* dbias, int64_t rows, int64_t cols, void* s);
int rms_norm_forward(Elem t, const void* x, const void* scale, void* out, float* inv_rms, int64_t rows, int64_t cols,
                     double eps, void* s);
int rms_norm_backward(Elem t, const void* x, const void* scale, const float* inv_rms, const void* dout, void* dx,
                      void* dscale, int64_t rows, int64_t cols, void* s);

// Softmax over rows of `cols` values (softmax.cu), f32 or bf16 (f32 math); the backward from the
// output y.
int softmax_forward(Elem e, const void* x, void* y, int64_t rows, int64_t cols, void* s);
int softmax_backward(Elem e, const void* y, const void* dy, void* dx, int64_t rows, int64_t cols, void* s);

// Cross-entropy per row (loss 0 on ignored rows); `bad` (one int64, zero on entry) gets 1 + the
// first row whose label is neither ignore_index nor in [0, classes).
enum class Reduction : uint8_t { None, Sum, Mean };
int cross_entropy_rows(const float* logits, const int64_t* labels, float* loss, int64_t rows, int64_t classes,
                       int64_t ignore_index, int64_t* bad, void* s);
// out[0] = sum of loss over rows (Sum) or that over the non-ignored rows' count (Mean); count[0]
// = that count (as double).
int cross_entropy_reduce(const float* loss, const int64_t* labels, float* out, double* count, int64_t rows,
                         int64_t ignore_index, Reduction reduction, void* s);
// dlogits = (softmax(row) - onehot(label)) * w, w = dloss[row] (None), dloss[0] (Sum),
// dloss[0] / count[0] (Mean); 0 on ignored rows.
int cross_entropy_backward(const float* logits, const int64_t* labels, const float* dloss, const double* count,
                           float* dlogits, int64_t rows, int64_t classes, int64_t ignore_index, Reduction reduction,
                           void* s);

// Fused causal attention (attention_forward.cu, attention_backward.cu): q [B, G, R, S, D] (query
// head h = g R + r reads kv head g), k, v [B, G, S, D], doc [B, S] document ids or null, out and
// the gradients of their inputs' element type, lse [B, G, R, S] f32; D <= 128.
// path: Auto takes the tensor-core kernels (attention_mma_*.cu) for bf16 with head dim 64 or 128
// and 16-byte aligned pointers, the FMA kernels otherwise; Fma and TensorCore force one (the tests
// compare them; TensorCore where it does not apply is cudaErrorInvalidValue).
enum class AttentionPath : uint8_t { Auto, Fma, TensorCore };
struct AttentionShape {
  int64_t batch, groups, reps, seq, head_dim;
  float scale;
  AttentionPath path = AttentionPath::Auto;
};
int attention_forward(Elem e, const void* q, const void* k, const void* v, const int64_t* doc, void* out, float* lse,
                      const AttentionShape& a, void* s);
// delta: scratch of B G R S floats.
int attention_backward(Elem e, const void* q, const void* k, const void* v, const int64_t* doc, const void* out,
                       const float* lse, const void* dout, float* delta, void* dq, void* dk, void* dv,
                       const AttentionShape& a, void* s);

// Rotary embedding (rotary.cu): `rows` rows of head_dim values, row r at sequence index r % seq;
// positions [seq] (per_batch 0) or [B, seq] with per_batch rows a batch row; theta as float (the
// CPU rounds it so); sign -1 rotates back (the gradient).
struct RotaryShape {
  int64_t rows, seq, head_dim, per_batch;
  float theta;
};
int rotary(Elem e, const void* x, void* out, const void* positions, bool positions_i32, const RotaryShape& r, int sign,
           void* s);

// Embedding (embedding.cu): ids (n of them, i64 or i32) index the block of `rows` rows of `hidden`
// values starting at vocab row `offset`; an id outside the block gives (takes) a zero row.
// embedding_check_ids: bad (one int64, zero on entry) gets n - the first position whose id is
// outside [0, vocab_size). embedding_backward (f32, or bf16 summed in f32) needs `scratch` of
// embedding_backward_scratch_bytes(n, vocab_size) bytes; n < 2^31.
struct EmbeddingShape {
  int64_t rows, hidden, offset;
};
int embedding_check_ids(const void* ids, bool ids_i32, int64_t n, int64_t vocab_size, int64_t* bad, void* s);
int embedding_forward(Elem el, const void* ids, bool ids_i32, int64_t n, const void* weight, void* out,
                      const EmbeddingShape& e, void* s);
size_t embedding_backward_scratch_bytes(int64_t n, int64_t vocab_size);
int embedding_backward(Elem el, const void* ids, bool ids_i32, int64_t n, const void* dout, void* dweight,
                       const EmbeddingShape& e, int64_t vocab_size, void* scratch, void* s);

// MoE routing and dispatch on one device (moe_routing.cu, moe_dispatch.cu; moe.h says what each
// computes): f32 tokens x [tokens, hidden], gate [experts, hidden], router values in f64 as the
// CPU's; assignment a = t top_k + s. capacity < 0: dropless. pos[a]: a's row among the experts'
// rows, -1 when dropped; experts <= 1024.
struct MoeDims {
  int64_t tokens, hidden, experts, top_k;
};
int moe_route(const float* x, const float* gate, double* logits, double* probs, double* lse, int64_t* expert,
              double* weight, const MoeDims& m, bool normalize, bool sigmoid, void* s);
int moe_capacity(const int64_t* expert, uint8_t* kept, int64_t* counts, int64_t* dropped, float* aux, float* z,
                 const double* probs, const double* lse, int64_t capacity, const MoeDims& m, void* s);
int moe_plan(const int64_t* expert, const uint8_t* kept, int64_t* pos, int64_t* expert_rows, const MoeDims& m,
             void* s);
int moe_gather(const float* x, const int64_t* pos, float* rows, const MoeDims& m, void* s);
int moe_combine(const float* rows, const int64_t* pos, const double* weight, float* out, const MoeDims& m, void* s);
int moe_combine_backward(const float* dout, const float* rows, const int64_t* pos, const double* weight,
                         float* drows, double* dweight, const MoeDims& m, void* s);
int moe_gather_backward(const float* drows, const int64_t* pos, double* dx, const MoeDims& m, void* s);
// daux, dz: device scalars or null (0); dl: scratch [tokens, experts]; dx: the experts' share of
// x's gradient (f64), dx_out = it plus the router's.
struct MoeRouterGrad {
  const float *x, *gate;
  const double *logits, *probs, *lse;
  const int64_t *expert, *counts;
  double tokens_total;  // the N of the losses' gradients: every rank's tokens (one device: m.tokens)
  const double* dweight;
  const float *daux, *dz;
  double* dl;
  const double* dx;
  float *dgate, *dx_out;
};
int moe_router_backward(const MoeRouterGrad& g, const MoeDims& m, bool normalize, bool sigmoid, void* s);
// This token block's row of the router's sums (ops/moe/routing.cc's gather_block_sums): out[0..3) =
// head, then counts [top_k][experts] of the chosen experts, the sums over tokens of p [experts] and
// the sum of lse^2, each summed over the tokens in order (one thread a value).
struct MoeBlockHead {
  double token_offset, expert_offset, local_experts;
};
int moe_block_sums(const int64_t* expert, const double* probs, const double* lse, MoeBlockHead head, double* out,
                   const MoeDims& m, void* s);

}  // namespace shardwise::cuda::launch
