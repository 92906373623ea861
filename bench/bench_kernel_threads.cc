// The heavy non-GEMM kernels of a GPT-2 small step (T512, B4: 2048 tokens, d768, 12 heads, V50257)
// on a rank's kernel pool of 1 and of N threads (tensor/parallel.h), interleaved in one process:
// the median of `reps` calls each, and the ratio. The results are the same bits on both (checked).
//
//   bench_kernel_threads [--threads 2] [--reps 7]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "shardwise/comm/local.h"
#include "shardwise/ops/binary/kernels.h"
#include "shardwise/ops/index/kernels.h"
#include "shardwise/ops/norm/kernels.h"
#include "shardwise/ops/softmax/kernels.h"
#include "shardwise/ops/unary/kernels.h"
#include "shardwise/tensor/parallel.h"
#include "shardwise/train/optimizer.h"

namespace {

using namespace shardwise;
using Clock = std::chrono::steady_clock;

Tensor random(const Shape& s, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-2, 2);
  Tensor t = Tensor::uninitialized(DType::F32, s);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = u(gen);
  return t;
}

struct Case {
  std::string name;
  std::function<Tensor()> run;
};

double seconds(const std::function<Tensor()>& f, Tensor* out) {
  auto t0 = Clock::now();
  *out = f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--threads") == 0) threads = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: bench_kernel_threads [--threads N] [--reps R]\n");
      return 2;
    }
  }
  const int64_t tokens = 2048, d = 768, heads = 12, seq = 512, vocab = 50257;
  Tensor x = random({tokens, d}, 1), scale = random({d}, 2), bias = random({d}, 3), dy = random({tokens, d}, 4);
  Tensor h = random({tokens, 4 * d}, 5), dh = random({tokens, 4 * d}, 6);
  Tensor scores = random({tokens / seq * heads * seq, seq}, 7), dscores = random(scores.shape(), 8);
  Tensor logits = random({tokens, vocab}, 9);
  std::vector<int64_t> label_ids(static_cast<size_t>(tokens));
  for (size_t i = 0; i < label_ids.size(); ++i) label_ids[i] = static_cast<int64_t>((i * 7919) % vocab);
  Tensor labels = Tensor::from<int64_t>({tokens}, label_ids);
  Tensor wte = random({vocab, d}, 10);
  const int64_t n_opt = 16 << 20;  // 16 Mi parameters of AdamW state
  Tensor w = random({n_opt}, 11), m = random({n_opt}, 12), v = random({n_opt}, 13), g = random({n_opt}, 14);
  const train::AdamW adamw({0.9, 0.95, 1e-8, 0.1});
  const ops::LayerNormOutputs ln = ops::layer_norm(x, scale, bias, 1, 1e-5);
  const Tensor probs = ops::softmax(scores, -1);
  std::vector<Case> cases = {
      {"gelu fwd [2048, 3072]", [&] { return ops::unary(ops::UnaryOp::Gelu, h); }},
      {"gelu bwd [2048, 3072]", [&] { return ops::unary_backward(ops::UnaryOp::Gelu, h, Tensor(), dh); }},
      {"add + bias [2048, 3072]", [&] { return ops::binary(ops::BinaryOp::Add, h, random({4 * d}, 15)); }},
      {"add bwd (bias sum) [2048, 768]", [&] { return ops::binary_backward(ops::BinaryOp::Add, x, bias, Tensor(), dy).dy; }},
      {"layer_norm fwd [2048, 768]", [&] { return ops::layer_norm(x, scale, bias, 1, 1e-5).out; }},
      {"layer_norm bwd [2048, 768]", [&] { return ops::layer_norm_backward(x, scale, ln.mean, ln.rstd, dy, 1).dscale; }},
      {"softmax fwd [24576, 512]", [&] { return ops::softmax(scores, -1); }},
      {"softmax bwd [24576, 512]", [&] { return ops::softmax_backward(probs, dscores, -1); }},
      {"cross_entropy fwd [2048, 50257]",
       [&] { return ops::cross_entropy(logits, labels, -100, ops::LossReduction::Mean); }},
      {"cross_entropy bwd [2048, 50257]",
       [&] {
         return ops::cross_entropy_backward(logits, labels, Tensor::scalar(1.0f), -100, ops::LossReduction::Mean);
       }},
      {"embedding bwd [2048] x [50257, 768]",
       [&] { return ops::embedding_backward(labels, dy, {vocab, d}, 0, vocab); }},
      {"adamw 16 Mi", [&] {
         adamw.update(w.data<float>(), m.data<float>(), v.data<float>(), g.data<float>(), n_opt, true, 1e-4, 10);
         return Tensor();
       }},
  };
  std::printf("kernel threads 1 vs %d, median of %d interleaved calls each\n", threads, reps);
  std::printf("%-38s %10s %10s %8s\n", "kernel", "1 thr ms", "N thr ms", "speedup");
  // The pools live on a rank thread, as in a run.
  comm::LocalWorld::run(1, [&](comm::Communicator&) {
    ThreadPool one(1), many(threads);
    for (const Case& c : cases) {
      std::vector<double> t1, tn;
      for (int r = 0; r < reps; ++r) {
        Tensor a, b;
        {
          ParallelScope s(&one);
          t1.push_back(seconds(c.run, &a));
        }
        {
          ParallelScope s(&many);
          tn.push_back(seconds(c.run, &b));
        }
        if (a.defined() && std::memcmp(a.raw(), b.raw(), a.nbytes()) != 0) {
          std::fprintf(stderr, "%s: results differ between 1 and %d threads\n", c.name.c_str(), threads);
          std::exit(1);
        }
      }
      std::sort(t1.begin(), t1.end());
      std::sort(tn.begin(), tn.end());
      const double a = t1[t1.size() / 2] * 1e3, b = tn[tn.size() / 2] * 1e3;
      std::printf("%-38s %10.2f %10.2f %7.2fx\n", c.name.c_str(), a, b, a / b);
    }
  });
  return 0;
}
