#include "shardwise/cuda/gemm/blas.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "shardwise/core/error.h"
#include "shardwise/cuda/memory/cuda_memory.h"

namespace shardwise::cuda {

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLAS's advice for Hopper

void check_lt(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    fail("cuBLASLt: {} failed: {} ({})", what, cublasLtGetStatusString(status), static_cast<int>(status));
  }
}

// The largest power of two (at most 256) dividing the address and the batch stride in bytes: what
// the heuristic must assume of the operand's alignment.
uint32_t alignment(const void* p, int64_t stride_bytes) {
  uint64_t bits = reinterpret_cast<uintptr_t>(p) | 256u;
  if (stride_bytes != 0) bits |= static_cast<uint64_t>(stride_bytes);
  return static_cast<uint32_t>(bits & (~bits + 1));
}

using Key = std::tuple<int, int, int, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                       bool, uint32_t, uint32_t, uint32_t>;

struct State {
  std::mutex mu;
  std::map<int, cublasLtHandle_t> handles;
  std::map<std::pair<int, void*>, void*> workspaces;
  std::map<Key, cublasLtMatmulAlgo_t> algos;
  BlasStats stats;
};
State& state() {
  static State* s = new State;  // never destroyed: the handles outlive static destructors' order
  return *s;
}

cudaDataType_t cuda_type(DType t) { return t == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F; }

// RAII for the descriptors of one call.
struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// A column-major layout of `rows` x `cols` (ld = rows), batched.
void layout(cublasLtMatrixLayout_t* l, DType t, int64_t rows, int64_t cols, int64_t batch, int64_t stride) {
  check_lt(cublasLtMatrixLayoutCreate(l, cuda_type(t), static_cast<uint64_t>(rows), static_cast<uint64_t>(cols),
                                      rows),
           "cublasLtMatrixLayoutCreate");
  if (batch == 1) return;
  const int32_t count = static_cast<int32_t>(batch);
  check_lt(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count),
           "set batch count");
  check_lt(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
           "set batch stride");
}

// Row-major c = op(a) op(b) is column-major c^T = op(b)^T op(a)^T: cuBLASLt's first operand is b
// (stored column-major as b^T), its second a, and its result n x m.
void describe(Descs& d, const GemmSpec& s) {
  const cublasComputeType_t compute =
      s.in == DType::F32 && s.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  check_lt(cublasLtMatmulDescCreate(&d.op, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t ta = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, tb = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "set transa");
  check_lt(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "set transb");
  layout(&d.a, s.in, s.trans_b ? s.k : s.n, s.trans_b ? s.n : s.k, s.batch, s.stride_b);
  layout(&d.b, s.in, s.trans_a ? s.m : s.k, s.trans_a ? s.k : s.m, s.batch, s.stride_a);
  layout(&d.c, s.out, s.n, s.m, s.batch, s.stride_c);
}

void check_spec(const GemmSpec& s) {
  SW_CHECK(s.in == DType::F32 || s.in == DType::BF16, "cuda gemm: inputs must be f32 or bf16, got {}",
           dtype_name(s.in));
  SW_CHECK(s.out == DType::F32 || (s.out == DType::BF16 && s.in == DType::BF16),
           "cuda gemm: {} inputs cannot write {} (allowed: f32, or bf16 from bf16)", dtype_name(s.in),
           dtype_name(s.out));
  SW_CHECK(s.m >= 0 && s.n >= 0 && s.k >= 0 && s.batch >= 1, "cuda gemm: bad sizes m={} n={} k={} batch={}", s.m, s.n,
           s.k, s.batch);
  SW_CHECK(s.batch == 1 || s.stride_c != 0, "cuda gemm: {} batch items cannot all write one matrix (stride_c 0)",
           s.batch);
  SW_CHECK(!s.tf32 || s.in == DType::F32, "cuda gemm: tf32 applies to f32 inputs only, got {}", dtype_name(s.in));
}

cublasLtHandle_t handle_for(State& st, int device) {
  auto [it, fresh] = st.handles.try_emplace(device, nullptr);
  if (fresh) check_lt(cublasLtCreate(&it->second), "cublasLtCreate");
  return it->second;
}

void* workspace_for(State& st, int device, Stream stream) {
  auto [it, fresh] = st.workspaces.try_emplace({device, stream.handle}, nullptr);
  if (fresh) check(cudaMalloc(&it->second, kWorkspaceBytes), "cudaMalloc (cuBLASLt workspace)");
  return it->second;
}

cublasLtMatmulAlgo_t algo_for(State& st, cublasLtHandle_t h, Descs& d, const Key& key, const uint32_t (&align)[3]) {
  auto found = st.algos.find(key);
  if (found != st.algos.end()) return found->second;
  check_lt(cublasLtMatmulPreferenceCreate(&d.pref), "cublasLtMatmulPreferenceCreate");
  const uint64_t ws = kWorkspaceBytes;
  check_lt(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
           "set workspace");
  const cublasLtMatmulPreferenceAttributes_t which[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  const uint32_t values[4] = {align[1], align[0], align[2], align[2]};  // cuBLASLt's a is our b
  for (int i = 0; i < 4; ++i) {
    check_lt(cublasLtMatmulPreferenceSetAttribute(d.pref, which[i], &values[i], sizeof values[i]), "set alignment");
  }
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  check_lt(cublasLtMatmulAlgoGetHeuristic(h, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &result, &returned),
           "cublasLtMatmulAlgoGetHeuristic");
  SW_CHECK(returned > 0, "cuBLASLt: no algorithm for this GEMM");
  ++st.stats.heuristic_queries;
  return st.algos.emplace(key, result.algo).first->second;
}

}  // namespace

void gemm(Device device, Stream stream, const GemmSpec& s, const void* a, const void* b, void* c) {
  check_spec(s);
  if (s.m == 0 || s.n == 0 || s.k == 0) return;
  check(cudaSetDevice(device.index), "cudaSetDevice");
  const auto in_bytes = static_cast<int64_t>(dtype_size(s.in)), out_bytes = static_cast<int64_t>(dtype_size(s.out));
  const uint32_t align[3] = {alignment(a, s.stride_a * in_bytes), alignment(b, s.stride_b * in_bytes),
                             alignment(c, s.stride_c * out_bytes)};
  const Key key{device.index, static_cast<int>(s.in),  static_cast<int>(s.out), s.trans_a, s.trans_b, s.m,
                s.n,          s.k,  s.batch, s.stride_a, s.stride_b, s.stride_c, s.tf32, align[0], align[1], align[2]};
  Descs d;
  describe(d, s);
  State& st = state();
  std::lock_guard lock(st.mu);
  const cublasLtHandle_t h = handle_for(st, device.index);
  void* ws = workspace_for(st, device.index, stream);
  const cublasLtMatmulAlgo_t algo = algo_for(st, h, d, key, align);
  check_lt(cublasLtMatmul(h, d.op, &s.alpha, b, d.a, a, d.b, &s.beta, c, d.c, c, d.c, &algo, ws, kWorkspaceBytes,
                          static_cast<cudaStream_t>(stream.handle)),
           "cublasLtMatmul");
  ++st.stats.gemms;
}

BlasStats blas_stats() {
  State& st = state();
  std::lock_guard lock(st.mu);
  return st.stats;
}

}  // namespace shardwise::cuda
