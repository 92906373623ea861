#include "shardwise/cli/gemm_cmd.h"
#include "shardwise/cli/plan/machine_cache.h"

#include <dlfcn.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "shardwise/core/error.h"
#include "shardwise/tensor/gemm.h"
#include "shardwise/tensor/gemm_backend.h"
#include "shardwise/tensor/gemm_check.h"
#include "shardwise/core/plural.h"
#include "shardwise/core/table.h"

extern char** environ;

namespace shardwise::cli {

namespace {

using nlohmann::json;

// A candidate replaces OpenBLAS's own pick only when it measured at least this much faster.
constexpr double kMargin = 1.05;

// ---- the child: one backend, checked (and measured) in this process ----

// SHARDWISE_GEMM_CHECK_FAULT=<backend>:wrong|crash|missing makes that backend's probe return a
// wrong element, crash, or act as if its library were not installed: how the tests see that a
// failing candidate is reported and never chosen (and fails --quick), a missing one only reported.
std::string planted_fault(const std::string& name) {
  const char* fault = std::getenv("SHARDWISE_GEMM_CHECK_FAULT");
  if (!fault || std::string(fault).rfind(name + ":", 0) != 0) return "";
  return std::string(fault).substr(name.size() + 1);
}

SgemmFn probe_fn(const std::string& name) {
  SgemmFn fn = backend_sgemm;
  std::string kind = planted_fault(name);
  if (kind != "wrong" && kind != "crash") return fn;
  return [fn, kind](bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                    int ldb, float beta, float* c, int ldc) {
    if (kind == "crash") raise(SIGSEGV);
    fn(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    if (m > 1 && n > 1 && k > 1) c[static_cast<size_t>(m - 1) * ldc + n - 1] += 1e-3f;  // one element off
  };
}

// The child reports a crash as the signal that ended it, the same with and without a sanitizer: a
// sanitizer's handlers (AddressSanitizer's DEADLYSIGNAL report and exit) are replaced by the
// default action, so the parent sees the signal itself.
void default_crash_signals() {
  struct sigaction action {};
  action.sa_handler = SIG_DFL;
  sigemptyset(&action.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE}) sigaction(sig, &action, nullptr);
}

// Whether this CPU has the instructions of the OpenBLAS core type `core` ("" or another: yes).
// OpenBLAS runs a forced core type (OPENBLAS_CORETYPE) without asking the CPU: an AVX-512 kernel on
// a CPU without it dies of an illegal instruction.
bool cpu_runs_core(const std::string& core) {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  if (core == "haswell" || core == "zen") return avx2;
  if (core == "skylakex") return avx512;
  if (core == "cooperlake") return avx512 && __builtin_cpu_supports("avx512bf16");
  return true;
}

// Why backend `name` cannot run on this machine ("" when it can): an OpenBLAS core type this CPU
// lacks the instructions of, or (after `load_error`, the load's Error) a library that cannot be
// loaded at all, i.e. is not installed. Such a backend is reported, not failed.
std::string unavailable(const std::string& name, const std::string& load_error = "") {
  if (planted_fault(name) == "missing") return "not installed (planted: SHARDWISE_GEMM_CHECK_FAULT)";
  if (name.rfind("openblas-", 0) == 0 && !cpu_runs_core(name.substr(9)))
    return fmt::format("not supported by this CPU (core type {} needs instructions it lacks)", name.substr(9));
  if (load_error.empty()) return "";
  for (const char* lib : {"libopenblas.so.0", name == "blis" ? "libblis.so.4" : name == "onednn" ? "libdnnl.so.2" : ""}) {
    if (*lib && !dlopen(lib, RTLD_LAZY | RTLD_LOCAL)) return "not installed: " + load_error;
  }
  return "";
}

// The check's step shapes: the measured step's dims with 128 tokens (a quick run: a tiny model's).
StepShape check_shape(bool quick, const std::string& shape) {
  if (quick) return {2, 64, 4, 32, 257, 64};
  if (shape == "small") return {4, 256, 4, 128, 256, 128};
  return {12, 768, 12, 128, 50257, 128};
}

// Step-mix GFLOP/s: the GPT-2 small step (micro-batch 4 x 512 tokens; `small`: the small config,
// L4 d256 h4 T256 V256, 8 x 256 tokens), each GEMM timed (one run
// after a warm-up) at an eighth of its rows (the LM head at a sixteenth) and scaled to the full
// size, weighted by its calls per step: the step's GEMM FLOPs over its estimated GEMM time.
double measure_step(const SgemmFn& fn, const std::string& shape) {
  StepShape full;
  if (shape == "small") full = {4, 256, 4, 256, 256, 2048};
  StepShape part = full;
  part.tokens = full.tokens / 8;
  auto full_cases = step_gemm_cases(full), cases = step_gemm_cases(part);
  double flops = 0, seconds = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    GemmCase c = cases[i];
    if (c.what.rfind("lm_head", 0) == 0) (c.what == "lm_head dW" ? c.k : c.m) /= 2;
    const double scale = gemm_flops(full_cases[i]) / gemm_flops(c);
    seconds += full_cases[i].count * scale * time_sgemm(c, fn, 1);
    flops += full_cases[i].count * gemm_flops(full_cases[i]);
  }
  const double rate = flops / seconds / 1e9;
  SW_CHECK(std::isfinite(rate) && rate > 0, "gemm-check: the measurement gave {} GFLOP/s", rate);
  return rate;
}

// --probe NAME: the check (on 1 and 2 threads: the library's threaded split is checked too);
// --probe NAME --measure: the step-mix rate on 1 and 2 threads instead.
// A backend that cannot run here (unavailable()) prints {"name", "unavailable": why}.
int run_probe(const GemmCheckOptions& o, std::ostream& out) {
  alarm(600);  // a hung library fails its candidate instead of the whole check
  default_crash_signals();
  std::string why = unavailable(o.probe);
  const GemmBackendInfo* loaded = nullptr;
  if (why.empty()) {
    try {
      loaded = &load_gemm_backend(o.probe);
    } catch (const Error& e) {
      why = unavailable(o.probe, e.what());
      if (why.empty()) throw;
    }
  }
  if (!loaded) {
    out << "gemm-probe: " << json({{"name", o.probe}, {"unavailable", why}}).dump() << "\n";
    return 0;
  }
  const GemmBackendInfo& info = *loaded;
  SgemmFn fn = probe_fn(o.probe);
  json j = {{"name", info.name}, {"library", info.library}, {"core", info.core}, {"version", info.version}};
  if (o.measure) {
    for (int threads : {1, 2}) {
      set_blas_threads(threads);
      j["gflops"].push_back(measure_step(fn, o.shape));
    }
    out << "gemm-probe: " << j.dump() << "\n";
    return 0;
  }
  auto cases = odd_gemm_cases(o.quick ? 127 : 1025);
  auto step = step_gemm_cases(check_shape(o.quick, o.shape));
  cases.insert(cases.end(), step.begin(), step.end());
  bool ok = true;
  for (int threads : {1, 2}) {
    set_blas_threads(threads);
    auto r = check_sgemm(cases, fn, 1000 + threads);
    j["check"].push_back({{"threads", threads}, {"ok", r.ok}, {"worst", r.worst}, {"worst_case", r.worst_case},
                          {"cases", r.cases}, {"elements", r.elements}});
    ok = ok && r.ok;
  }
  j["ok"] = ok;
  out << "gemm-probe: " << j.dump() << "\n";
  return 0;
}

// ---- the parent: a child per candidate ----

// The child's environment: this one with AddressSanitizer's exit-time leak check off (ASAN_OPTIONS
// gains detect_leaks=0; nothing reads it without a sanitizer). A child is a probe whose answer is
// its output, and LeakSanitizer dies in its tracer ("Tracer caught signal 11", a fatal error and
// exit 1) on the OpenMP threads BLIS and oneDNN leave running: under `make test-asan` those two
// failed the check.
std::vector<std::string> child_environment() {
  std::vector<std::string> env;
  std::string asan = "ASAN_OPTIONS=detect_leaks=0";
  for (char** e = environ; *e; ++e) {
    std::string v = *e;
    if (v.rfind("ASAN_OPTIONS=", 0) != 0) env.push_back(v);
    else if (v.size() > 13) asan = v + ":detect_leaks=0";  // the last setting wins
  }
  env.push_back(asan);
  return env;
}

json spawn_probe(const std::string& name, bool quick, bool measure, const std::string& shape) {
  std::vector<std::string> args = {"shardwise", "gemm-check", "--probe", name, "--shape", shape};
  if (quick) args.push_back("--quick");
  if (measure) args.push_back("--measure");
  std::vector<std::string> env = child_environment();
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& v : env) envp.push_back(v.data());
  envp.push_back(nullptr);
  int fds[2];
  SW_CHECK(pipe(fds) == 0, "gemm-check: pipe failed: {}", std::strerror(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  SW_CHECK(rc == 0, "gemm-check: cannot start a child process: {}", std::strerror(rc));
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  json j = {{"name", name}, {"ok", false}};
  if (auto at = text.rfind("gemm-probe: "); at != std::string::npos && WIFEXITED(status) && WEXITSTATUS(status) == 0)
    return json::parse(text.substr(at + 12, text.find('\n', at) - at - 12));
  if (WIFSIGNALED(status)) {
    j["error"] = fmt::format("crashed ({})", strsignal(WTERMSIG(status)));
  } else {
    auto at = text.find("error: ");
    std::string msg = at == std::string::npos ? text : text.substr(at + 7);
    j["error"] = msg.substr(0, msg.find('\n'));
  }
  return j;
}

double score(const json& c) {  // the geometric mean of the 1- and 2-thread rates
  if (!c.value("ok", false) || !c.contains("gflops")) return 0;
  return std::sqrt(c["gflops"][0].get<double>() * c["gflops"][1].get<double>());
}

// The fastest passing candidate; OpenBLAS's own pick unless another is kMargin faster.
std::string pick(const json& candidates) {
  std::string best;
  double best_score = 0, base = 0;
  for (const auto& c : candidates) {
    if (c["name"] == "openblas") base = score(c);
    if (score(c) > best_score) best_score = score(c), best = c["name"];
  }
  if (base > 0 && best_score < kMargin * base) return "openblas";
  return best;
}

std::string describe_check(const json& c) {
  if (c.contains("unavailable")) return c["unavailable"].get<std::string>();
  if (c.contains("error")) return c["error"].get<std::string>();
  std::string s;
  for (const auto& r : c["check"]) {
    if (!r["ok"].get<bool>()) return fmt::format("FAIL on {}: {} (error {:.3g} x tolerance)",
                                                 counted(r["threads"].get<int>(), "thread"), r["worst_case"].get<std::string>(),
                                                 r["worst"].get<double>());
    s = fmt::format("pass ({}, worst {:.2g} x tol)", counted(r["cases"].get<int>(), "case"), r["worst"].get<double>());
  }
  return s;
}

// ---- the cache: $XDG_CACHE_HOME/shardwise/gemm.json, keyed by CPU and library files ----

std::filesystem::path cache_path() { return machine_cache_path("gemm.json"); }
std::string cache_key() { return machine_cache_key(); }

json read_cache() {
  std::ifstream in(cache_path());
  if (!in) return nullptr;
  json j = json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("key", "") != cache_key()) return nullptr;
  return j;
}

void write_cache(const json& j) { write_machine_cache(cache_path(), j.dump(1) + "\n", "GEMM cache"); }

constexpr int kRounds = 3;  // measurement rounds, candidates interleaved in each (a shared machine's load evens out)

// Checks every candidate in a child process, then measures the passing ones in kRounds
// interleaved rounds (a child per candidate per round; the best rate per thread count counts).
json check_all(const std::vector<std::string>& names, bool quick, const std::string& shape, std::ostream& out) {
  json candidates = json::array();
  for (const auto& name : names) candidates.push_back(spawn_probe(name, quick, false, shape));
  // openblas-<core> naming the core OpenBLAS picks itself is the same library as `openblas`.
  std::string own_core;
  for (const auto& c : candidates)
    if (c["name"] == "openblas" && c.value("ok", false)) own_core = c.value("core", "");
  for (auto& c : candidates)
    if (c["name"] != "openblas" && c.value("library", "").rfind("OpenBLAS", 0) == 0 && c.value("core", "") == own_core)
      c["same_as_openblas"] = true;
  for (int round = 0; round < (quick ? 0 : kRounds); ++round)
    for (auto& c : candidates) {
      if (!c.value("ok", false) || c.value("same_as_openblas", false)) continue;
      json m = spawn_probe(c["name"], false, true, shape);
      if (!m.contains("gflops")) {
        c["ok"] = false, c["error"] = "measurement: " + m.value("error", std::string("no result"));
        continue;
      }
      if (!c.contains("gflops")) c["gflops"] = {0.0, 0.0};
      for (int t = 0; t < 2; ++t) c["gflops"][t] = std::max(c["gflops"][t].get<double>(), m["gflops"][t].get<double>());
    }
  using A = TextTable::Align;
  TextTable table({A::Left, A::Left, A::Right, A::Right, A::Left});
  table.row({"backend", "library", "GFLOP/s 1t", "2t", "check vs float64 (error / tolerance)"});
  for (const auto& c : candidates) {
    std::string g1 = "-", g2 = "-";
    if (c.contains("gflops"))
      g1 = fmt::format("{:.1f}", c["gflops"][0].get<double>()), g2 = fmt::format("{:.1f}", c["gflops"][1].get<double>());
    table.row({c["name"].get<std::string>(), c.value("library", "-"), g1, g2,
               describe_check(c) + (c.value("same_as_openblas", false) ? "; the same as openblas" : "")});
  }
  out << table.str();
  return candidates;
}

// --quick (a gate of `make test`): every backend that can run here must pass; one that cannot (not
// installed, a core type this CPU lacks) is reported above and not counted. Exit 1 naming the
// failed ones, or when none passed at all.
int quick_verdict(const json& candidates, std::ostream& out) {
  std::vector<std::string> failed, passed;
  for (const auto& c : candidates) {
    if (c.contains("unavailable")) continue;
    (c.value("ok", false) ? passed : failed).push_back(c["name"].get<std::string>());
  }
  if (!failed.empty()) {
    out << fmt::format("quick check FAILED: every installed backend must pass; failed: {}\n", fmt::join(failed, ", "));
    return 1;
  }
  if (passed.empty()) {
    out << "no backend passed the check\n";
    return 1;
  }
  out << fmt::format("quick check done: every installed backend passed ({}; no measurement)\n", fmt::join(passed, ", "));
  return 0;
}

}  // namespace

CLI::App* add_gemm_check_command(CLI::App& app, GemmCheckOptions& o) {
  auto* cmd = app.add_subcommand("gemm-check", "Check every GEMM library against float64, measure it and pick the default");
  cmd->add_option("--candidates", o.candidates, "backends to check (default: all; the cached choice is then among these)")->delimiter(',');
  cmd->add_flag("--quick", o.quick, "correctness on small shapes only (no measurement; the cache is left alone)");
  cmd->add_option("--shape", o.shape, "the training step whose GEMMs are measured: gpt2 (GPT-2 small, 124 M, "
                 "B4 T512) or small (L4 d256 h4 T256 V256 B8)")
      ->check(CLI::IsMember({"gpt2", "small"}));
  cmd->add_option("--probe", o.probe)->group("");  // internal: the child process of one candidate
  cmd->add_flag("--measure", o.measure)->group("");
  return cmd;
}

int cmd_gemm_check(const GemmCheckOptions& o, std::ostream& out) {
  if (!o.probe.empty()) return run_probe(o, out);
  auto names = o.candidates.empty() ? gemm_backend_names() : o.candidates;
  for (const auto& n : names) {
    const auto& all = gemm_backend_names();
    SW_CHECK(std::find(all.begin(), all.end(), n) != all.end(), "--candidates: unknown gemm backend '{}' (allowed: {})",
             n, fmt::join(all, ", "));
  }
  json candidates = check_all(names, o.quick, o.shape, out);
  if (o.quick) return quick_verdict(candidates, out);
  std::string chosen = pick(candidates);
  if (chosen.empty()) {
    out << "no backend passed the check\n";
    return 1;
  }
  char date[32];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  write_cache({{"key", cache_key()}, {"chosen", chosen}, {"measured", date}, {"shape", o.shape},
               {"candidates", candidates}});
  out << fmt::format("chosen: {} (the fastest that passed, geometric mean of 1 and 2 threads; OpenBLAS's own pick "
                     "unless another is {:.0f}% faster){}\n", chosen, (kMargin - 1) * 100,
                     fmt::format("; cached in {}", cache_path().string()));
  return 0;
}

std::string choose_gemm(const std::string& flag) {
  std::string name = flag, why = "--gemm " + flag + " (command line or config)";
  if (flag == "auto") {
    const char* user = std::getenv("OPENBLAS_CORETYPE");
    const char* env = std::getenv("SHARDWISE_GEMM");
    if (user && *user) {
      name = "openblas", why = fmt::format("the user's OPENBLAS_CORETYPE={}", user);
    } else if (env && *env && std::string(env) != "auto") {
      name = env, why = fmt::format("SHARDWISE_GEMM={}", env);
    } else {
      json cache = read_cache();
      // A run never measures by itself (the measurement takes minutes): OpenBLAS's own pick, which
      // `make test` checks against float64, until `shardwise gemm-check` has cached a choice (it
      // checks and measures every backend and caches the fastest correct one). One short line.
      if (cache.is_null()) {
        return fmt::format("gemm: openblas = {}; no choice cached: run `shardwise gemm-check`",
                           load_gemm_backend("openblas").library);
      }
      name = cache["chosen"];
      why = fmt::format("chosen by check and measurement ({}, {})", cache_path().string(),
                        cache.value("measured", "?"));
    }
  }
  const auto& info = load_gemm_backend(name);
  return fmt::format("gemm: {} = {}; f64 on core {}; {}", info.name, info.library, info.core, why);
}

}  // namespace shardwise::cli
