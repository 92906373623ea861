// Ring attention's overlap (ring.h: the next block travels while the current tile is computed):
// the results are bit for bit those of the steps made one after another (a reference on one
// thread, from the ring's formulas), on rings of 3 and 4 ranks with uneven and empty blocks; the
// transfers are started, not blocking calls; and a backend whose started calls are blocking
// synchronous calls made at the wait does not deadlock.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "shardwise/comm/local.h"
#include "shardwise/mesh/shard_math.h"
#include "shardwise/ops/attention/ring.h"
#include "tests/comm/forwarder.h"
#include "tests/ops/attention/attention_inputs.h"

namespace shardwise::ops {
namespace {

using namespace testing_attention;  // NOLINT: the shared inputs and comparisons

// Rank r's (out, lse, dq) and block r's (dk, dv), computed step by step without a ring: rank r
// meets block (r - t) mod n at step t, merged by log-sum-exp in that order; block b's gradient
// starts at its owner and gathers each next rank's share around the ring.
struct Reference {
  std::vector<Tensor> out, lse, dq, dk, dv;
};
Reference sequential(const std::vector<Tensor>& q, const std::vector<Tensor>& k, const std::vector<Tensor>& v,
                     const std::vector<Tensor>& dout, const std::vector<mesh::Range>& blocks, const Tensor& doc,
                     const AttentionArgs& a, int64_t T) {
  const int n = static_cast<int>(q.size());
  Reference ref;
  auto coords = [&](int r, int owner) {
    AttentionCoords at;
    at.query0 = blocks[static_cast<size_t>(r)].offset, at.seq = T, at.key0 = blocks[static_cast<size_t>(owner)].offset;
    return at;
  };
  for (int r = 0; r < n; ++r) {
    const auto i = static_cast<size_t>(r);
    Tensor out = Tensor::full(DType::F64, q[i].shape(), 0.0);
    Tensor lse = Tensor::full(DType::F64, attention_lse_shape(q[i].shape()), -std::numeric_limits<double>::infinity());
    const int64_t D = q[i].shape()[q[i].shape().ndim() - 1];
    for (int t = 0; t < n; ++t) {
      const int owner = (r + n - t) % n;
      if (blocks[i].size == 0 || blocks[static_cast<size_t>(owner)].size == 0) continue;
      const AttentionOutputs o = flash_attention(q[i], k[static_cast<size_t>(owner)], v[static_cast<size_t>(owner)], doc, a,
                                                 coords(r, owner));
      double *po = out.data<double>(), *pl = lse.data<double>();
      const double *bo = o.out.data<double>(), *bl = o.lse.data<double>();
      for (int64_t row = 0; row < lse.numel(); ++row) {
        if (std::isinf(bl[row]) && bl[row] < 0) continue;
        const double m = std::max(pl[row], bl[row]), l = m + std::log(std::exp(pl[row] - m) + std::exp(bl[row] - m));
        const double wa = std::exp(pl[row] - l), wb = std::exp(bl[row] - l);
        for (int64_t d = 0; d < D; ++d) po[row * D + d] = wa * po[row * D + d] + wb * bo[row * D + d];
        pl[row] = l;
      }
    }
    ref.out.push_back(out), ref.lse.push_back(lse);
  }
  for (int r = 0; r < n; ++r) ref.dq.push_back(Tensor::full(DType::F64, q[static_cast<size_t>(r)].shape(), 0.0));
  for (int b = 0; b < n; ++b) {
    Tensor dk = Tensor::full(DType::F64, k[static_cast<size_t>(b)].shape(), 0.0), dv = Tensor::full(DType::F64, v[static_cast<size_t>(b)].shape(), 0.0);
    for (int j = 0; j < n; ++j) {
      const int r = (b + j) % n;
      const auto i = static_cast<size_t>(r);
      if (blocks[i].size == 0 || blocks[static_cast<size_t>(b)].size == 0) continue;
      const AttentionGrads g = flash_attention_backward(q[i], k[static_cast<size_t>(b)], v[static_cast<size_t>(b)], doc,
                                                        ref.out[i], ref.lse[i], dout[i], a, coords(r, b));
      for (int64_t e = 0; e < dk.numel(); ++e) dk.data<double>()[e] += g.dk.data<double>()[e];
      for (int64_t e = 0; e < dv.numel(); ++e) dv.data<double>()[e] += g.dv.data<double>()[e];
    }
    ref.dk.push_back(dk), ref.dv.push_back(dv);
  }
  // dq: rank r adds its steps' shares in step order.
  for (int r = 0; r < n; ++r) {
    const auto i = static_cast<size_t>(r);
    for (int t = 0; t < n; ++t) {
      const int owner = (r + n - t) % n;
      if (blocks[i].size == 0 || blocks[static_cast<size_t>(owner)].size == 0) continue;
      const AttentionGrads g = flash_attention_backward(q[i], k[static_cast<size_t>(owner)], v[static_cast<size_t>(owner)],
                                                        doc, ref.out[i], ref.lse[i], dout[i], a, coords(r, owner));
      for (int64_t e = 0; e < ref.dq[i].numel(); ++e) ref.dq[i].data<double>()[e] += g.dq.data<double>()[e];
    }
  }
  return ref;
}

// A communicator whose blocking send waits until the receiver has taken the message (MPI_Ssend):
// with the base class's start_send / start_recv (made at the wait) over it, a ring that waited in
// an unsafe order would deadlock.
class SynchronousSends final : public comm::Forwarder {
 public:
  explicit SynchronousSends(comm::Communicator& c) : Forwarder(c) {}
  void send(const void* in, int64_t n, DType t, int peer, int tag) override {
    Forwarder::send(in, n, t, peer, tag);
    char ack = 0;
    Forwarder::recv(&ack, 1, DType::U8, peer, tag + 1000);
  }
  void recv(void* out, int64_t n, DType t, int peer, int tag) override {
    Forwarder::recv(out, n, t, peer, tag);
    char ack = 1;
    Forwarder::send(&ack, 1, DType::U8, peer, tag + 1000);
  }
};

// Records the point-to-point calls (blocking or started) and forwards them to the real backend.
class Recorder final : public comm::Forwarder {
 public:
  explicit Recorder(comm::Communicator& c) : Forwarder(c), inner_(c) {}
  void send(const void* in, int64_t n, DType t, int peer, int tag) override {
    calls.push_back("send");
    Forwarder::send(in, n, t, peer, tag);
  }
  void recv(void* out, int64_t n, DType t, int peer, int tag) override {
    calls.push_back("recv");
    Forwarder::recv(out, n, t, peer, tag);
  }
  std::unique_ptr<comm::Request> start_send(const void* in, int64_t n, DType t, int peer, int tag) override {
    calls.push_back("start_send " + std::to_string(tag));
    return inner_.start_send(in, n, t, peer, tag);
  }
  std::unique_ptr<comm::Request> start_recv(void* out, int64_t n, DType t, int peer, int tag) override {
    calls.push_back("start_recv " + std::to_string(tag));
    return inner_.start_recv(out, n, t, peer, tag);
  }
  std::vector<std::string> calls;

 private:
  comm::Communicator& inner_;
};

enum class Backend { Local, SynchronousDefault, Recorded };

struct RingRun {
  std::vector<Tensor> out, lse, dq, dk, dv;
  std::vector<std::vector<std::string>> calls;
};

RingRun ring_run(int n, int64_t T, Backend backend, const std::vector<Tensor>& q, const std::vector<Tensor>& k,
             const std::vector<Tensor>& v, const std::vector<Tensor>& dout, const std::vector<mesh::Range>& blocks,
             const Tensor& doc, const AttentionArgs& a) {
  RingRun run;
  run.out.resize(static_cast<size_t>(n)), run.lse = run.dq = run.dk = run.dv = run.out;
  run.calls.resize(static_cast<size_t>(n));
  comm::LocalWorld::run(
      n,
      [&](comm::Communicator& world) {
        const auto i = static_cast<size_t>(world.rank());
        SynchronousSends sync(world);
        Recorder recorder(world);
        comm::Communicator* ring = backend == Backend::Local ? &world
                                   : backend == Backend::Recorded ? static_cast<comm::Communicator*>(&recorder)
                                                                  : &sync;
        AttentionCoords at;
        at.query0 = blocks[i].offset, at.seq = T;
        const AttentionOutputs o = ring_attention(q[i], k[i], v[i], doc, a, at, ring);
        const AttentionGrads g = ring_attention_backward(q[i], k[i], v[i], doc, o.out, o.lse, dout[i], a, at, ring);
        run.out[i] = o.out, run.lse[i] = o.lse, run.dq[i] = g.dq, run.dk[i] = g.dk, run.dv[i] = g.dv;
        run.calls[i] = recorder.calls;
      },
      std::chrono::seconds(30));
  return run;
}

struct Inputs {
  std::vector<Tensor> q, k, v, dout;
  std::vector<mesh::Range> blocks;
  Tensor doc;
};
Inputs split(int n, int64_t T, bool docs) {
  const Shape qs{2, 2, 2, T, 3}, kvs{2, 2, T, 3};
  Tensor q = random_f64(qs, 21), k = random_f64(kvs, 22), v = random_f64(kvs, 23), w = random_f64(qs, 24);
  Inputs in;
  in.doc = docs ? documents(2, T) : Tensor();
  for (int r = 0; r < n; ++r) {
    const mesh::Range b = mesh::chunk_range(T, n, r);
    in.blocks.push_back(b);
    in.q.push_back(rows(q, 3, b.offset, b.size).clone()), in.dout.push_back(rows(w, 3, b.offset, b.size).clone());
    in.k.push_back(rows(k, 2, b.offset, b.size).clone()), in.v.push_back(rows(v, 2, b.offset, b.size).clone());
  }
  return in;
}

TEST(RingAttentionOverlap, ResultsAreBitForBitThoseOfTheStepsOneAfterAnother) {
  // 4 ranks of 18, 18, 17, 17 rows (uneven, across the 64-key tile edge in all), 3 ranks of 1, 1, 0.
  for (auto [n, T, docs] : {std::tuple{4, int64_t{70}, true}, std::tuple{3, int64_t{2}, false}, std::tuple{4, int64_t{131}, false}}) {
    SCOPED_TRACE("ring of " + std::to_string(n) + ", " + std::to_string(T) + " rows");
    const Inputs in = split(n, T, docs);
    AttentionArgs a;
    a.scale = 0.4;
    const Reference ref = sequential(in.q, in.k, in.v, in.dout, in.blocks, in.doc, a, T);
    for (Backend backend : {Backend::Local, Backend::SynchronousDefault}) {
      SCOPED_TRACE(backend == Backend::Local ? "local" : "synchronous sends, started at the wait");
      const RingRun run = ring_run(n, T, backend, in.q, in.k, in.v, in.dout, in.blocks, in.doc, a);
      for (size_t r = 0; r < static_cast<size_t>(n); ++r) {
        const std::string rank = " rank " + std::to_string(r);
        expect_near(run.out[r], ref.out[r], 0.0, "out" + rank);
        expect_near(run.lse[r], ref.lse[r], 0.0, "lse" + rank);
        expect_near(run.dq[r], ref.dq[r], 0.0, "dq" + rank);
        expect_near(run.dk[r], ref.dk[r], 0.0, "dk" + rank);
        expect_near(run.dv[r], ref.dv[r], 0.0, "dv" + rank);
      }
    }
  }
}

// Every block travels by started sends and receives (one tag per kind: k 1, v 2, dk 3, dv 4), the
// next step's k and v started before the current step's gradients are waited for; no blocking
// send or receive.
TEST(RingAttentionOverlap, BlocksTravelByStartedTransfers) {
  const int n = 3;
  const Inputs in = split(n, 12, false);
  AttentionArgs a;
  a.scale = 0.4;
  const RingRun run = ring_run(n, 12, Backend::Recorded, in.q, in.k, in.v, in.dout, in.blocks, in.doc, a);
  for (int r = 0; r < n; ++r) {
    const bool even = r % 2 == 0;
    auto pair = [&](int tag) {
      const std::string s = "start_send " + std::to_string(tag), v = "start_recv " + std::to_string(tag);
      return even ? std::vector<std::string>{s, v} : std::vector<std::string>{v, s};
    };
    std::vector<std::string> want;
    auto add = [&](int tag) { for (auto& c : pair(tag)) want.push_back(c); };
    for (int t = 0; t + 1 < n; ++t) add(1), add(2);  // forward: the next k, v at each step
    for (int t = 0; t < n; ++t) {                     // backward
      if (t + 1 < n) add(1), add(2);
      add(3), add(4);
    }
    EXPECT_EQ(run.calls[static_cast<size_t>(r)], want) << "rank " << r;
  }
}

}  // namespace
}  // namespace shardwise::ops
