// GPT training throughput of shardwise on one rank (issue 6), for bench/run_gpt.sh to put beside
// PyTorch's (bench/gpt_torch_throughput.py), and the machine's OpenBLAS SGEMM rate for the model
// FLOPs utilization.
//
//   bench_gpt train --threads 1 --steps 6 [--layers 4 --hidden 256 --heads 4 --seq 256 --vocab 256 --batch 8]
//                   [--recompute none|full|selective --dropout P --release 0|1 --kernel-threads N]
//   bench_gpt sgemm --threads 1 [--n 2048]
//
// train: training steps (forward, backward, clipping, AdamW) on a byte-level text file; prints the
// tokens/s of the steps after the first (as the PyTorch script does), the median step and the model
// FLOPs per token, and the activations: the bytes a micro-batch keeps after its forward, the
// pipeline's peak of frames in flight and the storage cache's peak bytes in use during a step
// (activations, gradients and recomputed values; parameters and moments included). sgemm: the
// best of several C = A * B on n x n f32 matrices, in GFLOP/s.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "shardwise/comm/local.h"
#include "shardwise/tensor/allocator.h"
#include "shardwise/tensor/gemm.h"
#include "shardwise/tensor/gemm_backend.h"
#include "shardwise/tensor/parallel.h"
#include "shardwise/train/trainer.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string mode;
  int threads = 1, steps = 6, n = 2048;
  int kernel_threads = -1;  // --kernel-threads: the rank's kernel pool (-1: as --threads; 1: GEMMs only, main's behaviour)
  int64_t layers = 4, hidden = 256, heads = 4, seq = 256, vocab = 256, batch = 8;
  std::string data = "README.md";
  std::string recompute = "none";
  double dropout = 0;
  bool release = true;  // --release 0: one stage keeps what the gradients read the shape of (main's behaviour before recompute)
  std::string gemm = "openblas";  // the GEMM backend (tensor/gemm_backend.h)
};

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: bench_gpt train|sgemm [--threads N] [--steps K] [--n SIZE] [--layers L] [--hidden H] "
               "[--heads NH] [--seq S] [--vocab V] [--batch B] [--data FILE] [--recompute MODE] [--dropout P] "
               "[--release 0|1] [--gemm BACKEND] [--kernel-threads N]\n");
  std::exit(2);
}

Options parse(int argc, char** argv) {
  if (argc < 2) usage();
  Options o;
  o.mode = argv[1];
  if (o.mode != "train" && o.mode != "sgemm") usage();
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) usage();
    std::string v = argv[++i];
    if (a == "--gemm") o.gemm = v;
    else if (a == "--threads") o.threads = std::stoi(v);
    else if (a == "--kernel-threads") o.kernel_threads = std::stoi(v);
    else if (a == "--steps") o.steps = std::stoi(v);
    else if (a == "--n") o.n = std::stoi(v);
    else if (a == "--layers") o.layers = std::stoll(v);
    else if (a == "--hidden") o.hidden = std::stoll(v);
    else if (a == "--heads") o.heads = std::stoll(v);
    else if (a == "--seq") o.seq = std::stoll(v);
    else if (a == "--vocab") o.vocab = std::stoll(v);
    else if (a == "--batch") o.batch = std::stoll(v);
    else if (a == "--data") o.data = v;
    else if (a == "--recompute") o.recompute = v;
    else if (a == "--dropout") o.dropout = std::stod(v);
    else if (a == "--release") o.release = v != "0";
    else usage();
  }
  return o;
}

// Matmul FLOPs per token of one training step (forward + backward), as in the PaLM paper's MFU:
// 6 x (parameters in matmuls) + 12 x layers x seq x hidden (attention scores and context, computed
// over the full seq x seq matrix, forward and the two backward products). The matmul parameters
// are 12 H^2 per layer (q, k, v, o: 4 H^2; MLP: 8 H^2) plus the tied LM head V x H; biases,
// LayerNorm, softmax, GELU and the optimizer are not counted.
double flops_per_token(const Options& o) {
  const double L = static_cast<double>(o.layers), H = static_cast<double>(o.hidden);
  const double S = static_cast<double>(o.seq), V = static_cast<double>(o.vocab);
  const double matmul_params = L * 12 * H * H + V * H;
  return 6 * matmul_params + 12 * L * S * H;
}

int run_sgemm(const Options& o) {
  shardwise::set_blas_threads(o.threads);
  const int n = o.n;
  std::vector<float> a(static_cast<size_t>(n) * n), b(a.size()), c(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>(i % 97) * 0.01f;
    b[i] = static_cast<float>(i % 89) * 0.01f;
  }
  double best = 0;
  for (int rep = 0; rep < 6; ++rep) {
    auto t0 = Clock::now();
    shardwise::backend_sgemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (rep > 0) best = std::max(best, 2.0 * n * n * static_cast<double>(n) / s / 1e9);
  }
  std::printf("%s sgemm threads %d: %.1f GFLOP/s (n = %d, best of 5 after a warm-up)\n", o.gemm.c_str(), o.threads, best, n);
  return 0;
}

int run_train(const Options& o) {
  using namespace shardwise;
  shardwise::set_blas_threads(o.threads);
  train::TrainConfig c;
  c.model.layers = o.layers, c.model.hidden = o.hidden, c.model.heads = o.heads, c.model.seq = o.seq;
  c.model.vocab = o.vocab;
  c.mesh = "dp=1";
  c.global_batch = o.batch;
  c.micro_batch = 0, c.accumulation = 1;
  c.steps = o.steps;
  c.data = o.data;
  c.model.recompute = o.recompute;
  c.dropout = o.dropout;
  c.pipeline_release = o.release;
  c.check(1);
  std::vector<double> times;
  int64_t kept = 0, frames_peak = 0, in_use_peak = 0;
  comm::LocalWorld::run(1, [&](comm::Communicator& w) {
    RankThreads threads(o.kernel_threads);  // the rank's kernel threads (tensor/parallel.h)
    train::Trainer t(c, w.group(w.members()));
    for (int s = 0; s < o.steps; ++s) {
      reset_allocator_peak();
      auto t0 = Clock::now();
      t.step();
      times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      in_use_peak = std::max(in_use_peak, allocator_stats().peak_in_use_bytes);
    }
    kept = t.stages().last_stats().forward_bytes.at(0);
    frames_peak = t.stages().last_stats().peak_activation_bytes;
  });
  std::vector<double> steady(times.size() > 1 ? times.begin() + 1 : times.begin(), times.end());
  double sum = 0;
  for (double s : steady) sum += s;
  const double tokens = static_cast<double>(o.batch * o.seq);
  const double tps = tokens / (sum / static_cast<double>(steady.size()));
  std::sort(steady.begin(), steady.end());
  std::printf("shardwise threads %d: %.0f tokens/s (median step %.0f ms, first step excluded; %.2f MFLOP/token)\n",
              o.threads, tps, steady[steady.size() / 2] * 1e3, flops_per_token(o) / 1e6);
  constexpr double MiB = 1 << 20;
  std::printf("recompute %s: kept after forward %.1f MiB, peak of frames %.1f MiB, peak storage in use %.1f MiB\n",
              o.recompute.c_str(), static_cast<double>(kept) / MiB, static_cast<double>(frames_peak) / MiB,
              static_cast<double>(in_use_peak) / MiB);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  if (o.kernel_threads < 1) o.kernel_threads = o.threads;
  try {
    const auto& be = shardwise::load_gemm_backend(o.gemm);
    std::printf("gemm backend %s: %s\n", be.name.c_str(), be.library.c_str());
    return o.mode == "sgemm" ? run_sgemm(o) : run_train(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpt: %s\n", e.what());
    return 1;
  }
}
