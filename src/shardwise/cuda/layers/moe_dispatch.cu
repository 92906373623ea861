// The MoE dispatch on one device (ops/moe/kernels.cc's row movement with every exchange a copy):
// each kept assignment a = t top_k + s gets row pos[a] of the experts' rows, expert-major and in
// assignment order within an expert (plan_dispatch's order); the gather copies x's rows there, the
// combine sums a token's kept slots in slot order, weight * y in double (dropped slots add
// nothing), and their backward: the experts' input gradient dout * weight and dweight = dout . y,
// then dx = the sum, in slot order and double, of the rows' input gradients. No atomics.
#include <cuda_runtime.h>

#include "shardwise/cuda/common/block_reduce.cuh"
#include "shardwise/cuda/common/launchers.h"

namespace shardwise::cuda::launch {

namespace {

using detail::grid_for;
using detail::kBlock;
using detail::warp_sum;

// One block of `experts` threads (<= 1024): each counts its kept assignments, thread 0 lays the
// experts' rows out, then each numbers its assignments in order.
__global__ void plan_rows(const long long* expert, const unsigned char* kept, long long* pos, long long* expert_rows,
                          MoeDims m) {
  extern __shared__ long long first[];
  const long long e = threadIdx.x, n = m.tokens * m.top_k;
  long long count = 0;
  if (e < m.experts) {
    for (long long a = 0; a < n; ++a) count += expert[a] == e && kept[a] ? 1 : 0;
    expert_rows[e] = count;
    first[e] = count;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    long long at = 0;
    for (long long i = 0; i < m.experts; ++i) {
      const long long c = first[i];
      first[i] = at;
      at += c;
    }
  }
  __syncthreads();
  if (e >= m.experts) return;
  long long row = first[e];
  for (long long a = 0; a < n; ++a) {
    if (expert[a] != e) continue;
    pos[a] = kept[a] ? row++ : -1;
  }
}

__global__ void gather_rows(const float* x, const long long* pos, float* rows, MoeDims m) {
  const long long n = m.tokens * m.top_k * m.hidden;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long a = i / m.hidden, c = i % m.hidden, p = pos[a];
    if (p >= 0) rows[p * m.hidden + c] = x[(a / m.top_k) * m.hidden + c];
  }
}

__global__ void combine_rows(const float* rows, const long long* pos, const double* weight, float* out, MoeDims m) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < m.tokens * m.hidden;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long t = i / m.hidden, c = i % m.hidden;
    double acc = 0.0;
    for (long long s = 0; s < m.top_k; ++s) {
      const long long a = t * m.top_k + s, p = pos[a];
      if (p >= 0) acc += weight[a] * static_cast<double>(rows[p * m.hidden + c]);
    }
    out[i] = static_cast<float>(acc);
  }
}

// drows[pos[a]] = dout[t] * float(weight[a]) (the experts' output gradient, as the CPU rounds it).
__global__ void combine_grad_rows(const float* dout, const long long* pos, const double* weight, float* drows,
                                  MoeDims m) {
  const long long n = m.tokens * m.top_k * m.hidden;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long a = i / m.hidden, c = i % m.hidden, p = pos[a];
    if (p >= 0) drows[p * m.hidden + c] = dout[(a / m.top_k) * m.hidden + c] * static_cast<float>(weight[a]);
  }
}

// One warp per assignment: dweight[a] = dout[t] . y[pos[a]] in double (0 for a dropped one).
__global__ void combine_grad_weight(const float* dout, const float* rows, const long long* pos, double* dweight,
                                   MoeDims m) {
  const long long n = m.tokens * m.top_k, warps = static_cast<long long>(gridDim.x) * blockDim.x / 32;
  for (long long a = (blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x) / 32; a < n; a += warps) {
    const long long p = pos[a], t = a / m.top_k;
    double s = 0.0;
    for (long long c = threadIdx.x % 32; p >= 0 && c < m.hidden; c += 32) {
      s += static_cast<double>(dout[t * m.hidden + c]) * static_cast<double>(rows[p * m.hidden + c]);
    }
    s = warp_sum(s);
    if (threadIdx.x % 32 == 0) dweight[a] = s;
  }
}

__global__ void gather_grad(const float* drows, const long long* pos, double* dx, MoeDims m) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < m.tokens * m.hidden;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long t = i / m.hidden, c = i % m.hidden;
    double acc = 0.0;
    for (long long s = 0; s < m.top_k; ++s) {
      const long long p = pos[t * m.top_k + s];
      if (p >= 0) acc += static_cast<double>(drows[p * m.hidden + c]);
    }
    dx[i] = acc;
  }
}

cudaStream_t raw(void* s) { return static_cast<cudaStream_t>(s); }
long long* ll(int64_t* p) { return reinterpret_cast<long long*>(p); }
const long long* ll(const int64_t* p) { return reinterpret_cast<const long long*>(p); }

}  // namespace

int moe_plan(const int64_t* expert, const uint8_t* kept, int64_t* pos, int64_t* expert_rows, const MoeDims& m,
             void* s) {
  if (m.experts > 1024) return cudaErrorInvalidValue;
  const unsigned threads = static_cast<unsigned>((m.experts + 31) / 32 * 32);
  plan_rows<<<1, threads, sizeof(long long) * static_cast<size_t>(m.experts), raw(s)>>>(ll(expert), kept, ll(pos),
                                                                                       ll(expert_rows), m);
  return cudaGetLastError();
}

int moe_gather(const float* x, const int64_t* pos, float* rows, const MoeDims& m, void* s) {
  const long long n = m.tokens * m.top_k * m.hidden;
  if (n > 0) gather_rows<<<grid_for(n), kBlock, 0, raw(s)>>>(x, ll(pos), rows, m);
  return cudaGetLastError();
}

int moe_combine(const float* rows, const int64_t* pos, const double* weight, float* out, const MoeDims& m, void* s) {
  if (m.tokens * m.hidden > 0) combine_rows<<<grid_for(m.tokens * m.hidden), kBlock, 0, raw(s)>>>(rows, ll(pos), weight, out, m);
  return cudaGetLastError();
}

int moe_combine_backward(const float* dout, const float* rows, const int64_t* pos, const double* weight,
                         float* drows, double* dweight, const MoeDims& m, void* s) {
  const long long n = m.tokens * m.top_k;
  if (n == 0) return cudaSuccess;
  if (m.hidden > 0) combine_grad_rows<<<grid_for(n * m.hidden), kBlock, 0, raw(s)>>>(dout, ll(pos), weight, drows, m);
  combine_grad_weight<<<grid_for(n * 32), kBlock, 0, raw(s)>>>(dout, rows, ll(pos), dweight, m);
  return cudaGetLastError();
}

int moe_gather_backward(const float* drows, const int64_t* pos, double* dx, const MoeDims& m, void* s) {
  if (m.tokens * m.hidden > 0) gather_grad<<<grid_for(m.tokens * m.hidden), kBlock, 0, raw(s)>>>(drows, ll(pos), dx, m);
  return cudaGetLastError();
}

}  // namespace shardwise::cuda::launch
