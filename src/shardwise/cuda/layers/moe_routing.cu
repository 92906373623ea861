// The MoE router on the device (ops/moe/routing.cc's route on one device): logits = x gate^T in
// double, p = softmax over the experts (or sigmoid per expert), lse; the top_k experts by p (ties:
// the lower expert index) with their weights (renormalised to sum 1 with `normalize`); capacity
// by (slot, token) priority; the aux and z losses; and the router's backward to dgate and dx.
// Every sum runs in one thread or one warp in a fixed order: deterministic. A first version: one
// block per token for the logits, one thread per token or expert for the rest (E is small).
#include <cuda_runtime.h>

#include "shardwise/cuda/common/block_reduce.cuh"
#include "shardwise/cuda/common/launchers.h"

namespace shardwise::cuda::launch {

namespace {

using detail::grid_for;
using detail::kBlock;
using detail::warp_sum;

constexpr int kRouteThreads = 128;

__device__ double sigmoid_of(double l) { return l >= 0 ? 1.0 / (1.0 + exp(-l)) : exp(l) / (1.0 + exp(l)); }

// One block per token: each warp takes every 4th expert's logit; thread 0 the softmax, top-k.
__global__ void route_token(const float* x, const float* gate, double* logits, double* probs, double* lse,
                            long long* expert, double* weight, MoeDims m, bool normalize, bool sigmoid) {
  extern __shared__ double logit[];
  const long long t = blockIdx.x, E = m.experts, k = m.top_k;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (long long e = warp; e < E; e += kRouteThreads / 32) {
    double s = 0.0;
    for (long long c = lane; c < m.hidden; c += 32) {
      s += static_cast<double>(x[t * m.hidden + c]) * static_cast<double>(gate[e * m.hidden + c]);
    }
    s = warp_sum(s);
    if (lane == 0) logit[e] = s;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  double mx = -INFINITY, sum = 0.0;
  for (long long e = 0; e < E; ++e) mx = fmax(mx, logit[e]);
  for (long long e = 0; e < E; ++e) sum += exp(logit[e] - mx);
  double* p = probs + t * E;
  for (long long e = 0; e < E; ++e) {
    logits[t * E + e] = logit[e];
    p[e] = sigmoid ? sigmoid_of(logit[e]) : exp(logit[e] - mx) / sum;
  }
  lse[t] = mx + log(sum);
  double chosen_sum = 0.0;
  for (long long s = 0; s < k; ++s) {  // the best expert not yet chosen: higher p, then lower index
    long long best = -1;
    for (long long e = 0; e < E; ++e) {
      bool taken = false;
      for (long long q = 0; q < s; ++q) taken = taken || expert[t * k + q] == e;
      if (!taken && (best < 0 || p[e] > p[best])) best = e;
    }
    expert[t * k + s] = best;
    chosen_sum += p[best];
  }
  for (long long s = 0; s < k; ++s) {
    const double pe = p[expert[t * k + s]];
    weight[t * k + s] = normalize ? pe / chosen_sum : pe;
  }
}

// One thread per expert: its assignments in (slot, token) order, the first `capacity` kept.
__global__ void capacity_of(const long long* expert, unsigned char* kept, long long* counts, MoeDims m,
                            long long capacity) {
  const long long e = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (e >= m.experts) return;
  long long n = 0;
  for (long long s = 0; s < m.top_k; ++s) {
    for (long long t = 0; t < m.tokens; ++t) {
      const long long a = t * m.top_k + s;
      if (expert[a] != e) continue;
      kept[a] = capacity < 0 || n < capacity ? 1 : 0;
      ++n;
    }
  }
  counts[e] = n;
}

// One block: dropped = sum max(0, count - capacity); aux = E sum_e count_e P_e / N^2 with P_e the
// sum over tokens of p; z = sum lse^2 / N.
__global__ void losses_of(const double* probs, const double* lse, const long long* counts, long long* dropped,
                          float* aux, float* z, MoeDims m, long long capacity) {
  __shared__ double part[1024];
  double a = 0.0;
  for (long long e = threadIdx.x; e < m.experts; e += blockDim.x) {
    double pe = 0.0;
    for (long long t = 0; t < m.tokens; ++t) pe += probs[t * m.experts + e];
    a += static_cast<double>(counts[e]) * pe;
  }
  part[threadIdx.x] = a;
  __syncthreads();
  if (threadIdx.x != 0) return;
  double s = 0.0, zs = 0.0;
  long long drop = 0;
  for (int i = 0; i < blockDim.x; ++i) s += part[i];
  for (long long t = 0; t < m.tokens; ++t) zs += lse[t] * lse[t];
  for (long long e = 0; e < m.experts; ++e) drop += capacity < 0 ? 0 : max(0ll, counts[e] - capacity);
  const double n = static_cast<double>(m.tokens);
  dropped[0] = drop;
  aux[0] = m.tokens == 0 ? 0.0f : static_cast<float>(static_cast<double>(m.experts) * s / (n * n));
  z[0] = m.tokens == 0 ? 0.0f : static_cast<float>(zs / n);
}

// One thread per token: dl[t, e] = d loss / d logit (ops/moe/kernels.cc's router_backward).
__global__ void router_dlogits(const double* logits, const double* probs, const double* lse, const long long* expert,
                               const double* dweight, const long long* counts, double tokens_total, const float* daux,
                               const float* dz, double* dl, MoeDims m, bool normalize, bool sigmoid) {
  const long long t = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (t >= m.tokens) return;
  const long long E = m.experts, k = m.top_k;
  const double n = tokens_total, ga = daux ? *daux : 0.0, gz = dz ? *dz : 0.0;
  const double* p = probs + t * E;
  double* d = dl + t * E;
  for (long long e = 0; e < E; ++e) d[e] = ga * static_cast<double>(E) * static_cast<double>(counts[e]) / (n * n);
  double sum = 0.0, gp = 0.0;
  for (long long s = 0; s < k; ++s) {
    sum += p[expert[t * k + s]];
    gp += dweight[t * k + s] * p[expert[t * k + s]];
  }
  for (long long s = 0; s < k; ++s) {
    const double w = dweight[t * k + s];
    d[expert[t * k + s]] += normalize ? w / sum - gp / (sum * sum) : w;
  }
  double dot = 0.0;
  for (long long e = 0; e < E; ++e) dot += p[e] * d[e];
  const double zt = gz * 2.0 * lse[t] / n;
  for (long long e = 0; e < E; ++e) {
    const double dscore = sigmoid ? p[e] * (1.0 - p[e]) * d[e] : p[e] * (d[e] - dot);
    d[e] = dscore + zt * exp(logits[t * E + e] - lse[t]);
  }
}

// dgate[e, c] = sum over tokens (in order) of dl[t, e] x[t, c].
__global__ void router_dgate(const float* x, const double* dl, float* dgate, MoeDims m) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < m.experts * m.hidden;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long e = i / m.hidden, c = i % m.hidden;
    double s = 0.0;
    for (long long t = 0; t < m.tokens; ++t) s += dl[t * m.experts + e] * static_cast<double>(x[t * m.hidden + c]);
    dgate[i] = static_cast<float>(s);
  }
}

// dx_out[t, c] = dx[t, c] (the experts' share) + sum over experts (in order) of dl[t, e] gate[e, c].
__global__ void router_dx(const float* gate, const double* dl, const double* dx, float* dx_out, MoeDims m) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < m.tokens * m.hidden;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long t = i / m.hidden, c = i % m.hidden;
    double s = dx[i];
    for (long long e = 0; e < m.experts; ++e) s += dl[t * m.experts + e] * static_cast<double>(gate[e * m.hidden + c]);
    dx_out[i] = static_cast<float>(s);
  }
}

// One thread per value of the block's row: the head copied; counts[s][e] (the tokens whose slot s
// chose e), the sums of p over the tokens, the sum of lse^2, each over the tokens in order as the
// CPU's loop adds them.
__global__ void block_sums(const long long* expert, const double* probs, const double* lse, MoeBlockHead head,
                           double* out, MoeDims m) {
  const long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  const long long E = m.experts, k = m.top_k, counts = k * E;
  if (i >= 3 + counts + E + 1) return;
  if (i < 3) {
    out[i] = i == 0 ? head.token_offset : i == 1 ? head.expert_offset : head.local_experts;
    return;
  }
  const long long j = i - 3;
  double v = 0.0;
  if (j < counts) {
    const long long s = j / E, e = j % E;
    for (long long t = 0; t < m.tokens; ++t) v += expert[t * k + s] == e ? 1.0 : 0.0;
  } else if (j < counts + E) {
    for (long long t = 0; t < m.tokens; ++t) v += probs[t * E + (j - counts)];
  } else {
    for (long long t = 0; t < m.tokens; ++t) v += __dmul_rn(lse[t], lse[t]);  // rounded, then added: no FMA
  }
  out[i] = v;
}

cudaStream_t raw(void* s) { return static_cast<cudaStream_t>(s); }
long long* ll(int64_t* p) { return reinterpret_cast<long long*>(p); }
const long long* ll(const int64_t* p) { return reinterpret_cast<const long long*>(p); }

}  // namespace

int moe_route(const float* x, const float* gate, double* logits, double* probs, double* lse, int64_t* expert,
              double* weight, const MoeDims& m, bool normalize, bool sigmoid, void* s) {
  if (m.tokens == 0) return cudaSuccess;
  route_token<<<static_cast<unsigned>(m.tokens), kRouteThreads, sizeof(double) * static_cast<size_t>(m.experts),
                raw(s)>>>(x, gate, logits, probs, lse, ll(expert), weight, m, normalize, sigmoid);
  return cudaGetLastError();
}

int moe_capacity(const int64_t* expert, uint8_t* kept, int64_t* counts, int64_t* dropped, float* aux, float* z,
                 const double* probs, const double* lse, int64_t capacity, const MoeDims& m, void* s) {
  capacity_of<<<grid_for(m.experts), kBlock, 0, raw(s)>>>(ll(expert), kept, ll(counts), m, capacity);
  losses_of<<<1, kBlock, 0, raw(s)>>>(probs, lse, ll(counts), ll(dropped), aux, z, m, capacity);
  return cudaGetLastError();
}

int moe_router_backward(const MoeRouterGrad& g, const MoeDims& m, bool normalize, bool sigmoid, void* s) {
  if (m.tokens > 0) {
    router_dlogits<<<grid_for(m.tokens), kBlock, 0, raw(s)>>>(g.logits, g.probs, g.lse, ll(g.expert), g.dweight,
                                                              ll(g.counts), g.tokens_total, g.daux, g.dz, g.dl, m,
                                                              normalize, sigmoid);
  }
  router_dgate<<<grid_for(m.experts * m.hidden), kBlock, 0, raw(s)>>>(g.x, g.dl, g.dgate, m);
  if (m.tokens > 0) router_dx<<<grid_for(m.tokens * m.hidden), kBlock, 0, raw(s)>>>(g.gate, g.dl, g.dx, g.dx_out, m);
  return cudaGetLastError();
}

int moe_block_sums(const int64_t* expert, const double* probs, const double* lse, MoeBlockHead head, double* out,
                   const MoeDims& m, void* s) {
  block_sums<<<grid_for(3 + m.top_k * m.experts + m.experts + 1), kBlock, 0, raw(s)>>>(ll(expert), probs, lse, head,
                                                                                     out, m);
  return cudaGetLastError();
}

}  // namespace shardwise::cuda::launch
