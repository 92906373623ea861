#include "shardwise/tensor/gemm_backend.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <mutex>
#include <optional>

#include "shardwise/core/error.h"

namespace shardwise {

namespace {

// CBLAS enum values (cblas.h: CblasRowMajor, CblasNoTrans, CblasTrans), shared by OpenBLAS and BLIS.
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
using CblasSgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*,
                            int);
using CblasDgemm = void (*)(int, int, int, int, int, int, double, const double*, int, const double*, int, double,
                            double*, int);
using DnnlSgemm = int (*)(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                          float, float*, int64_t);
using SetThreads = void (*)(int);
using GetThreads = int (*)();
using CoreName = char* (*)();
struct DnnlVersion {
  int major, minor, patch;
  const char* hash;
  unsigned cpu_runtime, gpu_runtime;
};

struct Backend {
  GemmBackendInfo info;
  CblasSgemm sgemm = nullptr;  // cblas backends
  DnnlSgemm dnnl_sgemm = nullptr;
  CblasDgemm dgemm = nullptr;  // always OpenBLAS
  SetThreads openblas_threads = nullptr, blis_threads = nullptr, omp_threads = nullptr;
  GetThreads openblas_get_threads = nullptr;
};

std::mutex g_mutex;
std::atomic<const Backend*> g_backend{nullptr};
std::atomic<int> g_threads{0};  // set_blas_threads' request (0: none, each library's default)
// Pools that split GEMMs themselves (gemm_split_begin): while any is alive, every library runs one
// thread per call, and blas_threads() keeps answering the request, else the count OpenBLAS had
// when the first pool began (g_split_library), which the last gemm_split_end gives it back.
int g_split_pools = 0;  // under g_mutex
std::atomic<int> g_split_library{0};
std::atomic<bool> g_split{false};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return std::tolower(ch); });
  return s;
}

void* sym(void* handle, const char* name, const char* lib) {
  void* p = dlsym(handle, name);
  SW_CHECK(p != nullptr, "gemm backend: {} has no symbol {}", lib, name);
  return p;
}

// Loads OpenBLAS with OPENBLAS_CORETYPE=`core` set only for this dlopen ("" leaves the environment
// as it is). The variable is read by OpenBLAS's load-time constructor and restored right after.
void* load_openblas(const std::string& core) {
  const char* lib = "libopenblas.so.0";
  if (void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)) return h;  // already here: its core stays
  std::optional<std::string> saved;
  if (!core.empty()) {
    if (const char* v = std::getenv("OPENBLAS_CORETYPE")) saved = v;
    setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  }
  void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!core.empty()) {
    if (saved) setenv("OPENBLAS_CORETYPE", saved->c_str(), 1);
    else unsetenv("OPENBLAS_CORETYPE");
  }
  SW_CHECK(h != nullptr, "gemm backend: cannot load {} ({}); install Debian's libopenblas0", lib, dlerror());
  return h;
}

// Loads an OpenMP library (BLIS, oneDNN: libgomp comes with it) with OMP_WAIT_POLICY=PASSIVE set only
// for this dlopen when the user has not set it: libgomp reads it once, when it loads. With the
// default (threads spin after each parallel region) the idle GEMM thread took the core the rest of
// the step needed: the small config's 2-thread step ran 2.5-12x slower (BENCHMARKS.md).
void* load_openmp_library(const char* lib, std::string& policy) {
  const bool user = std::getenv("OMP_WAIT_POLICY") != nullptr;
  const bool fresh = dlopen("libgomp.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD) == nullptr;
  if (!user && fresh) setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!user && fresh) unsetenv("OMP_WAIT_POLICY");
  policy = user ? fmt::format("the user's OMP_WAIT_POLICY={}", std::getenv("OMP_WAIT_POLICY"))
                : fresh ? "OpenMP wait policy passive" : "OpenMP already loaded: its wait policy";
  return h;
}

std::unique_ptr<Backend> make_backend(const std::string& name) {
  auto b = std::make_unique<Backend>();
  b->info.name = name;
  const std::string core = name.rfind("openblas-", 0) == 0 ? name.substr(9) : "";
  void* ob = load_openblas(core);
  b->dgemm = reinterpret_cast<CblasDgemm>(sym(ob, "cblas_dgemm", "OpenBLAS"));
  b->openblas_threads = reinterpret_cast<SetThreads>(sym(ob, "openblas_set_num_threads", "OpenBLAS"));
  b->openblas_get_threads = reinterpret_cast<GetThreads>(sym(ob, "openblas_get_num_threads", "OpenBLAS"));
  b->info.core = reinterpret_cast<CoreName>(sym(ob, "openblas_get_corename", "OpenBLAS"))();
  std::string config = reinterpret_cast<CoreName>(sym(ob, "openblas_get_config", "OpenBLAS"))();
  SW_CHECK(core.empty() || lower(b->info.core) == core,
           "gemm backend {}: OpenBLAS is already loaded in this process with core type {} (the core type is fixed "
           "when the library loads; choose the backend before the first GEMM)", name, b->info.core);
  std::string ob_version = config.substr(0, config.find(' ', config.find(' ') + 1));  // "OpenBLAS 0.3.21"
  b->info.version = ob_version;
  if (name == "blis") {
    std::string policy;
    void* h = load_openmp_library("libblis.so.4", policy);
    SW_CHECK(h != nullptr, "gemm backend blis: cannot load libblis.so.4 ({}); install Debian's libblis-dev",
             dlerror());
    b->sgemm = reinterpret_cast<CblasSgemm>(sym(h, "cblas_sgemm", "BLIS"));
    b->blis_threads = reinterpret_cast<SetThreads>(sym(h, "bli_thread_set_num_threads", "BLIS"));
    std::string v = reinterpret_cast<CoreName>(sym(h, "bli_info_get_version_str", "BLIS"))();
    b->info.library = fmt::format("BLIS {} ({})", v, policy);
    b->info.version += ", BLIS " + v;
  } else if (name == "onednn") {
    std::string policy;
    void* h = load_openmp_library("libdnnl.so.2", policy);
    SW_CHECK(h != nullptr, "gemm backend onednn: cannot load libdnnl.so.2 ({}); install Debian's libdnnl-dev",
             dlerror());
    b->dnnl_sgemm = reinterpret_cast<DnnlSgemm>(sym(h, "dnnl_sgemm", "oneDNN"));
    auto* v = reinterpret_cast<const DnnlVersion* (*)()>(sym(h, "dnnl_version", "oneDNN"))();
    b->info.library = fmt::format("oneDNN {}.{}.{}", v->major, v->minor, v->patch);
    b->info.version += ", " + b->info.library;
    b->info.library += " (" + policy + ")";
    // Debian's oneDNN runs on OpenMP: its thread count is per calling thread (see backend_sgemm).
    if (void* omp = dlopen("libgomp.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD))
      b->omp_threads = reinterpret_cast<SetThreads>(dlsym(omp, "omp_set_num_threads"));
  } else {
    b->sgemm = reinterpret_cast<CblasSgemm>(sym(ob, "cblas_sgemm", "OpenBLAS"));
    b->info.library = fmt::format("{} (core {})", ob_version, b->info.core);
  }
  return b;
}

const Backend& current() {
  if (const Backend* b = g_backend.load(std::memory_order_acquire)) return *b;
  load_gemm_backend("openblas");
  return *g_backend.load(std::memory_order_acquire);
}

}  // namespace

const std::vector<std::string>& gemm_backend_names() {
  static const std::vector<std::string> names = {"openblas",          "openblas-haswell",    "openblas-zen",
                                                 "openblas-skylakex", "openblas-cooperlake", "blis",
                                                 "onednn"};
  return names;
}

const GemmBackendInfo& load_gemm_backend(const std::string& name) {
  const auto& names = gemm_backend_names();
  SW_CHECK(std::find(names.begin(), names.end(), name) != names.end(),
           "unknown gemm backend '{}' (allowed: auto, {})", name, fmt::join(names, ", "));
  std::lock_guard lock(g_mutex);
  if (const Backend* b = g_backend.load()) {
    SW_CHECK(b->info.name == name, "gemm backend {} requested, but this process already runs {} (chosen once, "
             "before the first GEMM)", name, b->info.name);
    return b->info;
  }
  auto b = make_backend(name);
  if (int t = g_split_pools > 0 ? 1 : g_threads.load(); t > 0) {
    b->openblas_threads(t);
    if (b->blis_threads) b->blis_threads(t);
  }
  g_backend.store(b.release(), std::memory_order_release);  // lives until exit (the library stays loaded)
  return g_backend.load()->info;
}

const GemmBackendInfo& gemm_backend() { return current().info; }

void backend_sgemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                   int ldb, float beta, float* c, int ldc) {
  const Backend& be = current();
  if (be.dnnl_sgemm) {
    // OpenMP's thread count is a per-thread setting: apply set_blas_threads' on each calling thread.
    thread_local int applied = 0;
    int want = g_split.load(std::memory_order_relaxed) ? 1 : g_threads.load(std::memory_order_relaxed);
    if (be.omp_threads && want > 0 && applied != want) {
      be.omp_threads(want);
      applied = want;
    }
    int st = be.dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    SW_CHECK(st == 0, "gemm: oneDNN's dnnl_sgemm failed (status {}) for m={} n={} k={}", st, m, n, k);
    return;
  }
  be.sgemm(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void backend_dgemm(bool ta, bool tb, int m, int n, int k, double alpha, const double* a, int lda, const double* b,
                   int ldb, double beta, double* c, int ldc) {
  current().dgemm(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c,
                  ldc);
}

// Threads each library may use per call (tensor/gemm.h).
void set_blas_threads(int threads) {
  if (threads <= 0) return;
  const Backend& be = current();
  std::lock_guard lock(g_mutex);
  g_threads.store(threads);
  const int lib = g_split_pools > 0 ? 1 : threads;
  be.openblas_threads(lib);
  if (be.blis_threads) be.blis_threads(lib);
}

// Only OpenBLAS's SGEMM is split (the bits of its blocks are checked); BLIS and oneDNN keep their threads.
void gemm_split_begin() {
  const Backend& be = current();
  std::lock_guard lock(g_mutex);
  if (be.info.name.rfind("openblas", 0) != 0 || g_split_pools++ > 0) return;
  g_split_library.store(std::max(1, be.openblas_get_threads()));  // the count it had (its default without a request)
  g_split.store(true);
  be.openblas_threads(1);
  if (be.blis_threads) be.blis_threads(1);
}

bool gemm_split_active() { return g_split.load(std::memory_order_relaxed); }

void gemm_split_end() {
  const Backend& be = current();
  std::lock_guard lock(g_mutex);
  if (be.info.name.rfind("openblas", 0) != 0 || g_split_pools == 0 || --g_split_pools > 0) return;
  g_split.store(false);
  // The request made since, else the count the library had before the first pool (a request of 0
  // stays 0: the library's default).
  const int t = g_threads.load() > 0 ? g_threads.load() : g_split_library.load();
  be.openblas_threads(t);
  if (be.blis_threads) be.blis_threads(t);
}

int blas_threads() {
  if (int t = g_threads.load(); t > 0) return t;
  if (g_split.load()) return g_split_library.load();
  return std::max(1, current().openblas_get_threads());
}

int blas_threads_requested() { return g_threads.load(); }

int gemm_library_threads() { return std::max(1, current().openblas_get_threads()); }

}  // namespace shardwise
