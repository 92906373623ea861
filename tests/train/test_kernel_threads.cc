// The rank's kernel threads (tensor/parallel.h) never change a result: every kernel split over the
// pool, AdamW, the gradient norm and short GPT-2 and Llama training runs give the same bits on 1, 2,
// 3 and 4 threads. The pools split every loop (grain 1), so each kernel's split points and its
// combining order are exercised on small tensors; the 1-thread pool runs each loop whole.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "shardwise/comm/local.h"
#include "shardwise/mesh/process_mesh.h"
#include "shardwise/ops/activation/kernels.h"
#include "shardwise/ops/attention/kernels.h"
#include "shardwise/ops/binary/kernels.h"
#include "shardwise/ops/index/kernels.h"
#include "shardwise/ops/misc/kernels.h"
#include "shardwise/ops/norm/kernels.h"
#include "shardwise/ops/rotary/kernels.h"
#include "shardwise/ops/shape/kernels.h"
#include "shardwise/ops/softmax/kernels.h"
#include "shardwise/ops/unary/kernels.h"
#include "shardwise/tensor/broadcast.h"
#include "shardwise/tensor/parallel.h"
#include "shardwise/train/optimizer.h"
#include "tests/support/llama_config.h"
#include "tests/support/small_config.h"

namespace shardwise {
namespace {

using Outputs = std::vector<Tensor>;

Tensor random(DType dtype, const Shape& s, unsigned seed, double lo = -2, double hi = 2) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(static_cast<size_t>(s.numel()));
  for (double& x : v) x = u(gen);
  return Tensor::from<double>(s, v).to(dtype);
}

Tensor ids(const Shape& s, int64_t vocab, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int64_t> u(0, vocab - 1);
  std::vector<int64_t> v(static_cast<size_t>(s.numel()));
  for (int64_t& x : v) x = u(gen);
  return Tensor::from<int64_t>(s, v);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// fn's outputs with a pool of `threads` that splits every loop.
Outputs on_threads(int threads, const std::function<Outputs()>& fn) {
  RankThreads rank_threads(threads, 1);
  return fn();
}

void expect_same_on_1_to_4_threads(const std::string& what, const std::function<Outputs()>& fn) {
  const Outputs whole = on_threads(1, fn);
  for (int threads : {2, 3, 4}) {
    const Outputs split = on_threads(threads, fn);
    ASSERT_EQ(split.size(), whole.size()) << what;
    for (size_t i = 0; i < whole.size(); ++i)
      EXPECT_TRUE(same_bits(whole[i], split[i])) << what << ": output " << i << " differs on " << threads << " threads";
  }
}

const Shape kX{3, 37, 50};  // 111 rows of 50: uneven pieces on 2, 3 and 4 threads

TEST(KernelThreads, ElementwiseUnaryBinaryAndBroadcastGradients) {
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor x = random(dt, kX, 1), y = random(dt, kX, 2, 0.5, 2), dy = random(dt, kX, 3);
    Tensor bias = random(dt, {50}, 4), col = random(dt, {3, 1, 50}, 5);
    for (auto op : {ops::UnaryOp::Gelu, ops::UnaryOp::Exp, ops::UnaryOp::Tanh, ops::UnaryOp::Silu}) {
      expect_same_on_1_to_4_threads(std::string(ops::unary_op_name(op)), [&] {
        Tensor out = ops::unary(op, x);
        return Outputs{out, ops::unary_backward(op, x, out, dy)};
      });
    }
    expect_same_on_1_to_4_threads("scale", [&] { return Outputs{ops::scale(x, 0.3, 1.5, true), ops::scale_backward(dy, 0.3)}; });
    for (auto op : {ops::BinaryOp::Add, ops::BinaryOp::Subtract, ops::BinaryOp::Multiply, ops::BinaryOp::Divide}) {
      expect_same_on_1_to_4_threads(std::string(ops::binary_op_name(op)), [&] {
        Outputs r{ops::binary(op, x, y), ops::binary(op, x, bias), ops::binary(op, col, y)};
        for (const Tensor& b : {bias, col}) {
          ops::BinaryGrads g = ops::binary_backward(op, x, b, Tensor(), ops::binary(op, x, b).clone());
          r.push_back(g.dx), r.push_back(g.dy);  // dy: the sum over the broadcast rows
        }
        return r;
      });
    }
  }
}

TEST(KernelThreads, NormsForwardAndBackward) {
  for (DType dt : {DType::F32, DType::F64}) {
    Tensor x = random(dt, kX, 11), scale = random(dt, {50}, 12), bias = random(dt, {50}, 13);
    Tensor dy = random(dt, kX, 14);
    expect_same_on_1_to_4_threads("layer_norm", [&] {
      ops::LayerNormOutputs f = ops::layer_norm(x, scale, bias, 2, 1e-5);
      ops::LayerNormGrads g = ops::layer_norm_backward(x, scale, f.mean, f.rstd, dy, 2);
      return Outputs{f.out, f.mean, f.rstd, g.dx, g.dscale, g.dbias};
    });
    expect_same_on_1_to_4_threads("rms_norm", [&] {
      ops::RmsNormOutputs f = ops::rms_norm(x, scale, 2, 1e-6);
      ops::RmsNormGrads g = ops::rms_norm_backward(x, scale, f.inv_rms, dy, 2);
      return Outputs{f.out, f.inv_rms, g.dx, g.dscale};
    });
  }
}

// Column sums over 150 columns (parallel_columns: ranges cut at multiples of 16, the last one
// shorter): the same bits on 1-4 threads, and the sums against loops written here.
TEST(KernelThreads, ColumnSumsOf150ColumnsAgainstALoop) {
  const Shape s{2, 9, 150};
  Tensor x = random(DType::F64, s, 21), scale = random(DType::F64, {150}, 22), bias = random(DType::F64, {150}, 23);
  Tensor dy = random(DType::F64, s, 24);
  expect_same_on_1_to_4_threads("layer_norm, rms_norm and a bias gradient, 150 columns", [&] {
    ops::LayerNormOutputs f = ops::layer_norm(x, scale, bias, 2, 1e-5);
    ops::LayerNormGrads g = ops::layer_norm_backward(x, scale, f.mean, f.rstd, dy, 2);
    ops::RmsNormOutputs r = ops::rms_norm(x, scale, 2, 1e-6);
    ops::RmsNormGrads rg = ops::rms_norm_backward(x, scale, r.inv_rms, dy, 2);
    return Outputs{g.dx, g.dscale, g.dbias, rg.dscale, reduce_to_shape(dy, {150})};
  });
  RankThreads pool(3, 1);
  const Tensor sum = reduce_to_shape(dy, {150});
  ops::LayerNormOutputs f = ops::layer_norm(x, scale, bias, 2, 1e-5);
  ops::LayerNormGrads g = ops::layer_norm_backward(x, scale, f.mean, f.rstd, dy, 2);
  for (int64_t c = 0; c < 150; ++c) {
    double want = 0, want_ds = 0;
    for (int64_t r = 0; r < 18; ++r) {
      double sum_x = 0, sum_sq = 0;
      for (int64_t j = 0; j < 150; ++j) sum_x += x.at(r * 150 + j);
      const double mu = sum_x / 150;
      for (int64_t j = 0; j < 150; ++j) sum_sq += (x.at(r * 150 + j) - mu) * (x.at(r * 150 + j) - mu);
      want += dy.at(r * 150 + c);
      want_ds += dy.at(r * 150 + c) * (x.at(r * 150 + c) - mu) / std::sqrt(sum_sq / 150 + 1e-5);
    }
    EXPECT_NEAR(sum.at(c), want, 1e-12) << "column " << c;
    EXPECT_NEAR(g.dbias.at(c), want, 1e-12) << "column " << c;
    EXPECT_NEAR(g.dscale.at(c), want_ds, 1e-9) << "column " << c;
  }
}

// transpose's copy split over the threads (each range of the output starts its own walk): the head
// split [B, S, NH, HD] -> [B, NH, S, HD] (whole rows copied) and a general permutation, against
// the index mapping written here.
TEST(KernelThreads, TransposeAgainstTheIndexMapping) {
  const Shape s{3, 7, 5, 4};
  Tensor x = random(DType::F32, s, 31);
  const ops::Perm heads{{0, 2, 1, 3}, 4}, general{{3, 1, 0, 2}, 4};
  expect_same_on_1_to_4_threads("transpose", [&] { return Outputs{ops::transpose(x, heads), ops::transpose(x, general)}; });
  RankThreads pool(3, 1);
  for (const ops::Perm& p : {heads, general}) {
    const Tensor y = ops::transpose(x, p);
    int64_t in[4], o = 0;
    for (in[p.to[0]] = 0; in[p.to[0]] < s[p.to[0]]; ++in[p.to[0]])
      for (in[p.to[1]] = 0; in[p.to[1]] < s[p.to[1]]; ++in[p.to[1]])
        for (in[p.to[2]] = 0; in[p.to[2]] < s[p.to[2]]; ++in[p.to[2]])
          for (in[p.to[3]] = 0; in[p.to[3]] < s[p.to[3]]; ++in[p.to[3]], ++o)
            ASSERT_EQ(y.at(o), x.at(((in[0] * s[1] + in[1]) * s[2] + in[2]) * s[3] + in[3])) << "output " << o;
  }
}

TEST(KernelThreads, SoftmaxAndCrossEntropy) {
  for (DType dt : {DType::F32, DType::F64}) {
    Tensor x = random(dt, kX, 21, -6, 6), dy = random(dt, kX, 22);
    for (int axis : {-1, 1}) {  // rows, and strided slices
      expect_same_on_1_to_4_threads("softmax axis " + std::to_string(axis), [&] {
        Tensor s = ops::softmax(x, axis), l = ops::log_softmax(x, axis);
        return Outputs{s, l, ops::softmax_backward(s, dy, axis), ops::log_softmax_backward(l, dy, axis)};
      });
    }
    Tensor labels = ids({3, 37}, 50, 23);
    labels.data<int64_t>()[5] = -100;  // ignored
    for (auto red : {ops::LossReduction::Mean, ops::LossReduction::Sum, ops::LossReduction::None}) {
      expect_same_on_1_to_4_threads("cross_entropy", [&] {
        Tensor loss = ops::cross_entropy(x, labels, -100, red);
        Tensor dloss = red == ops::LossReduction::None ? random(dt, {3, 37}, 24) : Tensor::full(dt, {}, 0.7);
        return Outputs{loss, ops::cross_entropy_backward(x, labels, dloss, -100, red)};
      });
    }
  }
}

TEST(KernelThreads, EmbeddingSwigluRotaryDropout) {
  Tensor weight = random(DType::F32, {11, 50}, 31), tokens = ids({4, 29}, 11, 32);  // ids repeat: the scatter-add sums
  Tensor dout = random(DType::F32, {4, 29, 50}, 33);
  expect_same_on_1_to_4_threads("embedding", [&] {
    return Outputs{ops::embedding(tokens, weight, 0, 11), ops::embedding_backward(tokens, dout, {11, 50}, 0, 11),
                   ops::embedding(tokens, weight.slice(std::vector<int64_t>{3, 0}, {5, 50}), 3, 11),
                   ops::embedding_backward(tokens, dout, {5, 50}, 3, 11)};
  });
  Tensor gate = random(DType::F32, kX, 34), up = random(DType::F32, kX, 35), dy = random(DType::F32, kX, 36);
  expect_same_on_1_to_4_threads("swiglu", [&] {
    ops::SwigluGrads g = ops::swiglu_backward(gate, up, dy);
    return Outputs{ops::swiglu(gate, up), g.dgate, g.dup};
  });
  Tensor q = random(DType::F32, {2, 3, 37, 8}, 37);
  std::vector<int64_t> pos(37);
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int64_t>(3 * i + 1);
  Tensor positions = Tensor::from<int64_t>({37}, pos);
  expect_same_on_1_to_4_threads("rotary", [&] {
    return Outputs{ops::rotary_embedding(q, positions, 10000), ops::rotary_embedding_backward(q, positions, 10000)};
  });
  ops::DropoutArgs args{0.3, 77, 5, true};
  expect_same_on_1_to_4_threads("dropout", [&] {
    ops::DropoutResult r = ops::dropout(gate, args);
    return Outputs{r.out, r.mask, ops::dropout_backward(dy, r.mask, args)};
  });
}

// Flash attention splits its (batch, kv head) blocks over the threads: grouped-query heads
// [B, G, R, S, D] with documents and dropout (each block's own keys), forward and backward.
TEST(KernelThreads, FlashAttentionForwardAndBackward) {
  const Shape qs{3, 2, 2, 70, 8}, kvs{3, 2, 70, 8};  // 6 blocks, two query heads each; 70 = 64 + 6 rows
  Tensor q = random(DType::F32, qs, 41), k = random(DType::F32, kvs, 42), v = random(DType::F32, kvs, 43);
  Tensor dout = random(DType::F32, qs, 44);
  std::vector<int64_t> doc(3 * 70);
  for (size_t i = 0; i < doc.size(); ++i) doc[i] = static_cast<int64_t>((i % 70) / 30);  // three documents a row
  Tensor docs = Tensor::from<int64_t>({3, 70}, doc);
  ops::AttentionArgs args;
  args.scale = 0.35;
  args.p = 0.2;
  args.seed = 9;
  expect_same_on_1_to_4_threads("flash_attention", [&] {
    ops::AttentionOutputs o = ops::flash_attention(q, k, v, docs, args);
    ops::AttentionGrads g = ops::flash_attention_backward(q, k, v, docs, o.out, o.lse, dout, args);
    return Outputs{o.out, o.lse, g.dq, g.dk, g.dv};
  });
}

// AdamW's update and the global gradient norm; the norm over gradients of several 64 Ki-element
// blocks also against a long double sum (the blocks' order changes only double rounding).
TEST(KernelThreads, AdamWAndGradientNorm) {
  const mesh::ProcessMesh mesh = mesh::parse_mesh("dp=1");
  std::vector<train::ParamState> params(2);
  std::vector<Tensor> grads = {random(DType::F32, {200003}, 41), random(DType::F32, {97, 13}, 42)};
  long double want = 0;
  for (const Tensor& g : grads)
    for (int64_t j = 0; j < g.numel(); ++j) want += static_cast<long double>(g.data<float>()[j]) * g.data<float>()[j];
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].dist = mesh::DistAttr(1);
    params[i].master = random(DType::F32, grads[i].shape(), 43 + static_cast<unsigned>(i));
    params[i].exp_avg = random(DType::F32, grads[i].shape(), 45 + static_cast<unsigned>(i), -0.1, 0.1);
    params[i].exp_avg_sq = random(DType::F32, grads[i].shape(), 47 + static_cast<unsigned>(i), 0, 0.01);
    params[i].param = params[i].master;
  }
  const train::AdamW adamw({0.9, 0.95, 1e-8, 0.1});
  expect_same_on_1_to_4_threads("adamw and grad norm", [&] {
    Outputs r;
    const int threads = parallel_threads();
    comm::LocalWorld::run(1, [&](comm::Communicator& w) {
      RankThreads rank_threads(threads, 1);  // the rank's thread gets a pool of the test's thread count
      const double norm = train::global_grad_norm(params, grads, mesh, w);
      EXPECT_NEAR(norm, std::sqrt(static_cast<double>(want)), 1e-12 * norm);
      std::vector<Tensor> g = {grads[0].clone(), grads[1].clone()};
      train::clip_grad_norm(g, norm, 1.0);
      std::vector<train::ParamState> p = params;
      for (auto& s : p) s.master = s.master.clone(), s.exp_avg = s.exp_avg.clone(), s.exp_avg_sq = s.exp_avg_sq.clone(), s.param = s.master;
      adamw.step(p, g, 1e-3, 3);
      r = {Tensor::scalar(norm), g[0], g[1]};
      for (auto& s : p) r.push_back(s.master), r.push_back(s.exp_avg), r.push_back(s.exp_avg_sq);
    });
    return r;
  });
}

// A few training steps of `c` on one rank with a pool of `threads` (grain 1): the losses, gradient
// norms and the final parameters.
Outputs train_on_threads(const train::TrainConfig& c, int threads) {
  Outputs r;
  comm::LocalWorld::run(1, [&](comm::Communicator& w) {
    RankThreads rank_threads(threads, 1);
    train::Trainer t(c, w.group(w.members()));
    for (int64_t s = 0; s < c.optimizer.steps; ++s) {
      train::StepResult step = t.step();
      r.push_back(Tensor::scalar(step.loss));
      r.push_back(Tensor::scalar(step.grad_norm));
    }
    for (const auto& p : t.params()) r.push_back(p.master), r.push_back(p.exp_avg_sq);
  });
  return r;
}

void expect_same_training(const std::string& what, const train::TrainConfig& c) {
  const Outputs whole = train_on_threads(c, 1);
  for (int threads : {2, 3}) {
    const Outputs split = train_on_threads(c, threads);
    ASSERT_EQ(split.size(), whole.size());
    for (size_t i = 0; i < whole.size(); ++i)
      EXPECT_TRUE(same_bits(whole[i], split[i])) << what << ": output " << i << " differs on " << threads << " threads";
  }
}

TEST(KernelThreads, GptTrainingIsTheSameOnOneTwoAndThreeThreads) {
  train::TrainConfig c = train::small_config("dp=1", 3);
  c.dropout = 0.1;
  expect_same_training("gpt2", c);
}

// Wide enough that the pool also splits the GEMMs (tensor/gemm.cc: pieces of >= 2 Mi multiply-adds;
// 640 tokens x hidden 256: every projection, the MLP, the head and their gradients).
TEST(KernelThreads, GptTrainingWithSplitGemmsIsTheSameOnOneTwoAndThreeThreads) {
  train::TrainConfig c = train::small_config("dp=1", 2);
  c.model.hidden = 256, c.optimizer.global_batch = 64;
  expect_same_training("gpt2 hidden 256", c);
}

TEST(KernelThreads, LlamaTrainingIsTheSameOnOneTwoAndThreeThreads) {
  expect_same_training("llama", train::llama_test_config("dp=1", 3));
}

}  // namespace
}  // namespace shardwise
