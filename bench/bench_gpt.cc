// GPT training throughput of shardwise on one rank (issue 6), for bench/run_gpt.sh to put beside
// PyTorch's (bench/gpt_torch_throughput.py), and the machine's OpenBLAS SGEMM rate for the model
// FLOPs utilization.
//
//   bench_gpt train --threads 1 --steps 6 [--layers 4 --hidden 256 --heads 4 --seq 256 --vocab 256 --batch 8]
//                   [--recompute none|full|selective --dropout P --release 0|1 --attention fused|unfused]
//                   [--lm-head fused|unfused --kernel-threads N]
//   bench_gpt sgemm --threads 1 [--n 2048]
//   bench_gpt attention --threads 1 [--seq 512 --heads 12 --hidden 768 --batch 4 --dropout P --steps 3]
//
// train: training steps (forward, backward, clipping, AdamW) on a byte-level text file; prints the
// tokens/s of the steps after the first (as the PyTorch script does), the median step and the model
// FLOPs per token, and the activations: the bytes a micro-batch keeps after its forward, the
// pipeline's peak of frames in flight and the storage cache's peak bytes in use during a step
// (activations, gradients and recomputed values; parameters and moments included). sgemm: the
// best of several C = A * B on n x n f32 matrices, in GFLOP/s. attention: one attention core's
// forward + backward on [batch, heads, seq, hidden / heads] f32, fused (flash_attention) and unfused
// (scale, scores matmul, causal mask add, softmax, dropout, probs x V and their backward kernels, as
// the unfused graph runs them, each tensor freed when that graph frees it), alternating, `steps`
// rounds: the best time of each and the storage cache's peak bytes in use above the inputs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "shardwise/comm/local.h"
#include "shardwise/core/philox.h"
#include "shardwise/ops/op.h"
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
  std::string data = "tests/data/fables.txt";  // a fixed corpus (README.md changes)
  std::string recompute = "none";
  std::string attention = "fused";
  std::string lm_head = "fused";  // --lm-head fused|unfused (GptConfig::lm_head)
  double dropout = 0;
  bool release = true;  // --release 0: one stage keeps what the gradients read the shape of (main's behaviour before recompute)
  std::string gemm = "openblas";  // the GEMM backend (tensor/gemm_backend.h)
};

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: bench_gpt train|sgemm|attention [--threads N] [--steps K] [--n SIZE] [--layers L] [--hidden H] "
               "[--heads NH] [--seq S] [--vocab V] [--batch B] [--data FILE] [--recompute MODE] [--dropout P] "
               "[--release 0|1] [--attention fused|unfused] [--lm-head fused|unfused] [--gemm BACKEND] [--kernel-threads N]\n");
  std::exit(2);
}

Options parse(int argc, char** argv) {
  if (argc < 2) usage();
  Options o;
  o.mode = argv[1];
  if (o.mode != "train" && o.mode != "sgemm" && o.mode != "attention") usage();
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
    else if (a == "--attention") o.attention = v;
    else if (a == "--lm-head") o.lm_head = v;
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
  c.parallel.mesh = "dp=1";
  c.optimizer.global_batch = o.batch;
  c.optimizer.micro_batch = 0, c.optimizer.accumulation = 1;
  c.optimizer.steps = o.steps;
  c.data.files = o.data;
  c.model.recompute = o.recompute;
  c.model.attention = o.attention;
  c.model.lm_head = o.lm_head;
  c.dropout = o.dropout;
  c.parallel.pipeline_release = o.release;
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
              (o.recompute + ", attention " + o.attention).c_str(), static_cast<double>(kept) / MiB, static_cast<double>(frames_peak) / MiB,
              static_cast<double>(in_use_peak) / MiB);
  return 0;
}

shardwise::Tensor random_tensor(const shardwise::Shape& shape, uint64_t seed) {
  shardwise::Tensor t(shardwise::DType::F32, shape);
  const shardwise::Philox rng(seed, 0);
  float* d = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) d[i] = rng.uniform(static_cast<uint64_t>(i)) - 0.5f;
  return t;
}

// One forward + backward of the unfused attention core; returns dq (the others dropped at once).
shardwise::Tensor unfused_step(const shardwise::Tensor& q, const shardwise::Tensor& k, const shardwise::Tensor& v,
                               const shardwise::Tensor& mask, const shardwise::Tensor& dout, double scale, double p) {
  using namespace shardwise;
  using namespace shardwise::ops;
  const OpRegistry& reg = op_registry();
  auto fwd = [&](const char* op, std::vector<Tensor> in, const Attrs& a) { return run_forward(reg.get(op), in, a); };
  auto bwd = [&](const char* op, std::vector<Tensor> in, std::vector<Tensor> out, std::vector<Tensor> g,
                 const Attrs& a) { return run_backward(reg.get(op), in, out, g, a); };
  const Attrs sc{{"scale", scale}, {"bias", 0.0}}, ty{{"trans_y", true}}, ax{{"axis", int64_t{-1}}};
  const Attrs dr{{"p", p}, {"seed", int64_t{1}}, {"stream", int64_t{2}}};
  Tensor qs = fwd("scale", {q}, sc)[0];
  Tensor probs;
  {
    Tensor scores = fwd("matmul", {qs, k}, ty)[0];
    probs = fwd("softmax", {fwd("add", {scores, mask}, {})[0]}, ax)[0];
  }
  std::vector<Tensor> dropped{probs, Tensor()};
  if (p > 0) dropped = fwd("dropout", {probs}, dr);
  Tensor ctx = fwd("matmul", {dropped[0], v}, {})[0];
  std::vector<Tensor> g2 = bwd("matmul", {dropped[0], v}, {ctx}, {dout}, {});
  ctx = Tensor();
  Tensor dprobs = p > 0 ? bwd("dropout", {probs}, dropped, {g2[0], Tensor()}, dr)[0] : g2[0];
  g2.clear();
  dropped.clear();
  Tensor dmasked = bwd("softmax", {probs}, {probs}, {dprobs}, ax)[0];
  probs = dprobs = Tensor();
  Tensor dscores = bwd("add", {dmasked, mask}, {dmasked}, {dmasked}, {})[0];
  dmasked = Tensor();
  std::vector<Tensor> g1 = bwd("matmul", {qs, k}, {dscores}, {dscores}, ty);
  return bwd("scale", {q}, {qs}, {g1[0]}, sc)[0];
}

int run_attention(const Options& o) {
  using namespace shardwise;
  shardwise::set_blas_threads(o.threads);
  RankThreads threads(o.kernel_threads);  // the kernels' own loops (flash attention's blocks, softmax, ...)
  const int64_t B = o.batch, NH = o.heads, S = o.seq, HD = o.hidden / o.heads;
  const Shape shape{B, NH, S, HD};
  Tensor q = random_tensor(shape, 1), k = random_tensor(shape, 2), v = random_tensor(shape, 3);
  Tensor dout = random_tensor(shape, 4), mask = train::causal_mask(S);
  const double scale = 1.0 / std::sqrt(static_cast<double>(HD));
  Attrs fa{{"scale", scale}};
  if (o.dropout > 0) fa.set("p", o.dropout), fa.set("seed", int64_t{1}), fa.set("stream", int64_t{2});
  const ops::OpDef& op = ops::op_registry().get("flash_attention");
  double best[2] = {1e30, 1e30};
  int64_t peak[2] = {0, 0};
  for (int round = 0; round < o.steps; ++round) {
    for (int fused = 1; fused >= 0; --fused) {
      const int64_t base = allocator_stats().in_use_bytes;
      reset_allocator_peak();
      auto t0 = Clock::now();
      if (fused) {
        std::vector<Tensor> out = ops::run_forward(op, std::vector<Tensor>{q, k, v}, fa);
        Tensor dlse(out[1].dtype(), out[1].shape());
        ops::run_backward(op, std::vector<Tensor>{q, k, v}, out, std::vector<Tensor>{dout, dlse}, fa);
      } else {
        unfused_step(q, k, v, mask, dout, scale, o.dropout);
      }
      best[fused] = std::min(best[fused], std::chrono::duration<double>(Clock::now() - t0).count());
      peak[fused] = std::max(peak[fused], allocator_stats().peak_in_use_bytes - base);
    }
  }
  constexpr double MiB = 1 << 20;
  std::printf("attention B%lld NH%lld S%lld HD%lld dropout %g threads %d: fused %.1f ms, peak %.1f MiB | unfused %.1f "
              "ms, peak %.1f MiB | time unfused/fused %.2fx, peak unfused/fused %.1fx\n",
              static_cast<long long>(B), static_cast<long long>(NH), static_cast<long long>(S),
              static_cast<long long>(HD), o.dropout, o.threads, best[1] * 1e3, static_cast<double>(peak[1]) / MiB,
              best[0] * 1e3, static_cast<double>(peak[0]) / MiB, best[0] / best[1],
              static_cast<double>(peak[0]) / static_cast<double>(std::max<int64_t>(peak[1], 1)));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  if (o.kernel_threads < 1) o.kernel_threads = o.threads;
  try {
    const auto& be = shardwise::load_gemm_backend(o.gemm);
    std::printf("gemm backend %s: %s\n", be.name.c_str(), be.library.c_str());
    if (o.mode == "attention") return run_attention(o);
    return o.mode == "sgemm" ? run_sgemm(o) : run_train(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpt: %s\n", e.what());
    return 1;
  }
}
