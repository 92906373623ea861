// The LM head + cross-entropy alone at the GPT-2 small shape (N = B·T = 2048 rows, H = 768,
// V = 50257, f32): forward + backward of the fused op (ops/softmax/lm_head.h) at several chunk
// budgets, its backward recomputing the logits ("recompute") or its gradients formed in the forward
// ("grads in fwd", forward_grads = 3 as the training graph runs it), against the unfused pair
// (matmul to the logits, cross_entropy, both backwards), in interleaved rounds; per variant the
// median milliseconds and the storage cache's peak bytes in use.
//
//   bench_lm_head [--threads T] [--rounds R] [--rows N] [--chunks MiB,MiB,...]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "shardwise/ops/op.h"
#include "shardwise/tensor/allocator.h"
#include "shardwise/tensor/gemm.h"

using namespace shardwise;
using Clock = std::chrono::steady_clock;

namespace {

Tensor random_f32(const Shape& s, unsigned seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, scale);
  Tensor t = Tensor::uninitialized(DType::F32, s);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(gen);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, rounds = 3;
  int64_t rows = 2048;
  std::string chunks = "64";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--threads") threads = std::stoi(argv[i + 1]);
    else if (a == "--rounds") rounds = std::stoi(argv[i + 1]);
    else if (a == "--rows") rows = std::stoll(argv[i + 1]);
    else if (a == "--chunks") chunks = argv[i + 1];
  }
  set_blas_threads(threads);
  const int64_t H = 768, V = 50257;
  Tensor h = random_f32({rows, H}, 1, 1.0f), w = random_f32({V, H}, 2, 0.02f);
  Tensor labels = Tensor::uninitialized(DType::I64, {rows});
  for (int64_t i = 0; i < rows; ++i) labels.data<int64_t>()[i] = (i * 7919) % V;
  const auto& reg = ops::op_registry();
  const Attrs sum{{"reduction", std::string("sum")}};
  // {name, chunk MiB (0: unfused), gradients in the forward}
  struct Variant {
    std::string name;
    int64_t mib;
    bool forward_grads;
  };
  std::vector<Variant> variants = {{"unfused", 0, false}};
  for (size_t at = 0; at < chunks.size();) {
    size_t end = chunks.find(',', at);
    const std::string mib = chunks.substr(at, end == std::string::npos ? std::string::npos : end - at);
    variants.push_back({"recompute " + mib + " MiB", std::stoll(mib), false});
    variants.push_back({"grads in fwd " + mib + " MiB", std::stoll(mib), true});
    at = end == std::string::npos ? chunks.size() : end + 1;
  }
  std::vector<std::vector<double>> ms(variants.size());
  std::vector<int64_t> peak(variants.size(), 0);
  Tensor dloss = Tensor::from<float>({}, {1.0f});
  for (int r = 0; r < rounds; ++r) {
    for (size_t v = 0; v < variants.size(); ++v) {
      reset_allocator_peak();
      const auto t0 = Clock::now();
      if (variants[v].mib == 0) {
        std::vector<Tensor> mm{h, w};
        Tensor logits = ops::run_forward(reg.get("matmul"), mm, {{"trans_y", true}})[0];
        std::vector<Tensor> ce{logits, labels};
        Tensor loss = ops::run_forward(reg.get("cross_entropy"), ce, sum)[0];
        std::vector<Tensor> out{loss}, dout{dloss};
        Tensor dlogits = ops::run_backward(reg.get("cross_entropy"), ce, out, dout, sum)[0];
        std::vector<Tensor> mo{logits}, md{dlogits};
        ops::run_backward(reg.get("matmul"), mm, mo, md, {{"trans_y", true}});
      } else {
        Attrs a = sum;
        a.set("chunk_bytes", variants[v].mib << 20);
        if (variants[v].forward_grads) a.set("forward_grads", int64_t{3});  // grad_scale 1 = dloss: no rescale
        std::vector<Tensor> in{h, w, labels};
        std::vector<Tensor> out = ops::run_forward(reg.get("lm_head_cross_entropy"), in, a);
        std::vector<Tensor> dout{dloss};
        for (size_t k = 1; k < out.size(); ++k) dout.push_back(Tensor());  // never read
        ops::run_backward(reg.get("lm_head_cross_entropy"), in, out, dout, a);
      }
      ms[v].push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      peak[v] = std::max(peak[v], allocator_stats().peak_in_use_bytes);
    }
  }
  std::printf("LM head forward + backward, N %lld H %lld V %lld f32, %d threads, %d interleaved rounds\n",
              static_cast<long long>(rows), static_cast<long long>(H), static_cast<long long>(V), threads, rounds);
  for (size_t v = 0; v < variants.size(); ++v) {
    std::sort(ms[v].begin(), ms[v].end());
    std::printf("%-22s median %7.0f ms (min %7.0f)  peak storage in use %7.1f MiB\n", variants[v].name.c_str(),
                ms[v][ms[v].size() / 2], ms[v][0], static_cast<double>(peak[v]) / (1 << 20));
  }
  return 0;
}
