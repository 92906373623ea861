#pragma once
// Which library runs the f32 GEMMs (tensor/gemm.h), loaded at run time with dlopen.
//
// Backends: "openblas" (Debian's OpenBLAS with the core type it picks itself, or the one the
// user's OPENBLAS_CORETYPE names), "openblas-<core>" (the same library with OPENBLAS_CORETYPE=<core>
// set for that one load: haswell, zen, skylakex, cooperlake), "blis" (libblis.so.4), "onednn"
// (libdnnl.so.2's dnnl_sgemm). f64 always runs on OpenBLAS, which every process loads once.
//
// OpenBLAS reads OPENBLAS_CORETYPE once, in its load-time constructor, and a process holds one copy
// of it: so the backend is chosen once per process, before the first GEMM, from the main thread
// (the variable is set only around the dlopen and restored right after, so child processes and
// the user's environment are untouched). A second, different OpenBLAS core type in the same
// process is refused; `shardwise gemm-check` compares core types in child processes instead.
#include <string>
#include <vector>

namespace shardwise {

struct GemmBackendInfo {
  std::string name;     // "openblas", "openblas-skylakex", "blis", "onednn"
  std::string library;  // what runs f32: "OpenBLAS 0.3.21 ... (core SkylakeX)", "BLIS 0.9.0", "oneDNN 2.6.3"
  std::string core;     // OpenBLAS's core name (also the one running f64)
  std::string version;  // the versions of every library loaded (the cache key of a measurement)
};

// Every backend name this build knows (each may still be missing on a machine).
const std::vector<std::string>& gemm_backend_names();

// Loads `name` as the process's GEMM backend and returns what was loaded. Error: an unknown name,
// a library that is not installed (naming the Debian package), a backend already chosen that differs,
// or an OpenBLAS core type that differs from the one already loaded.
const GemmBackendInfo& load_gemm_backend(const std::string& name);

// The backend in use; loads "openblas" on first use when none was chosen.
const GemmBackendInfo& gemm_backend();

// The f32 / f64 calls (row-major, trans flags, 32-bit dims checked by the caller).
void backend_sgemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                   int ldb, float beta, float* c, int ldc);
void backend_dgemm(bool ta, bool tb, int m, int n, int k, double alpha, const double* a, int lda, const double* b,
                   int ldb, double beta, double* c, int ldc);

}  // namespace shardwise
