// The MoE MLP's expert parallelism under MPI (issue 17; bench/moe.sh runs it, BENCHMARKS.md keeps
// the figures), every rank one ep rank of one expert group (the world), interleaved per iteration:
//
//   dispatch + combine, as moe_forward runs them (ops/moe/dispatch.h RowExchange, after the plan:
//   the counts came with the router's all_gather, which every path leaves out), against two raw
//   MPI_Alltoallv of the same counts and the same bytes (preallocated buffers, no packing):
//   - shared: each rank writes its kept rows straight into the node-shared region of the rank
//     owning their expert, a barrier, then (as the second Alltoallv lands the rows) each rank
//     copies its results from the experts' regions into a send-order buffer after the second
//     barrier (the kernel reads them there in its weighted combine instead; timed apart: "in place";
//     and in place with a third barrier after the reads, as one buffer instead of two halves needs);
//   - messages: each peer's rows packed just before their messages leave, all_to_all_pieces
//     landing them expert-major, and the inverse (SHARDWISE_MOE_EXCHANGE=messages).
//   experts: moe_forward on one rank's tokens with all E experts (router in double, grouped GEMMs,
//   combine) against a dense SwiGLU MLP of width top_k x F on the same tokens (equal active FLOPs).
//
//   mpirun -np 4 build/bench/bench_moe [tokens_per_rank] [hidden] [ffn] [experts] [top_k] [iters]
//
// Times are the slowest rank's; the figures are medians over iterations, and raw / it is also
// given as the median of each iteration's own ratio (steadier on a loaded machine).
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <utility>
#include <vector>

#include "shardwise/comm/mpi.h"
#include "shardwise/ops/moe/dispatch.h"
#include "shardwise/ops/moe/kernels.h"
#include "shardwise/ops/moe/routing.h"
#include "shardwise/tensor/gemm.h"

namespace {

using namespace shardwise;
namespace md = ops::moe_detail;

Tensor random_tensor(const Shape& shape, uint64_t seed, double scale) {
  Tensor t(DType::F32, shape);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, static_cast<float>(scale));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double slowest(double t) {
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return t;
}

// Dense SwiGLU on x [n, d] with w1, w3 [f, d], w2 [d, f]: y = (silu(x w1^T) * x w3^T) w2^T.
void dense_mlp(const Tensor& x, const Tensor& w1, const Tensor& w3, const Tensor& w2, std::vector<float>& h1,
               std::vector<float>& h3, std::vector<float>& y) {
  const int64_t n = x.shape()[0], d = x.shape()[1], f = w1.shape()[0];
  auto mm = [](const float* a, const float* b, float* c, int64_t m, int64_t nn, int64_t k) {
    GemmArgs g;
    g.trans_b = true, g.m = m, g.n = nn, g.k = k;
    gemm<float>(g, a, b, c);
  };
  mm(x.data<float>(), w1.data<float>(), h1.data(), n, f, d);
  mm(x.data<float>(), w3.data<float>(), h3.data(), n, f, d);
  for (size_t i = 0; i < h1.size(); ++i) h1[i] = h1[i] / (1.0f + std::exp(-h1[i])) * h3[i];
  mm(h1.data(), w2.data<float>(), y.data(), n, d, f);
}

// Dispatch + combine by `exchange` (plan included); `copy_back`: the results copied into a
// send-order buffer, as a message exchange delivers them; `third_barrier`: a barrier after the
// reads, as single buffering would need. Returns the seconds.
double dispatch_combine(comm::Communicator& world, const md::Routing& r, int64_t local, const ops::MoeShard& shard,
                        ops::MoeExchange exchange, const float* x, int64_t d, bool copy_back, bool third_barrier) {
  const double t0 = MPI_Wtime();
  md::DispatchPlan plan = md::plan_dispatch(r, local, shard);
  md::RowExchange<float> ex(&world, plan, exchange, d, d);
  if (ex.shared() != (exchange == ops::MoeExchange::Shared)) throw std::runtime_error("not the exchange asked for");
  ex.dispatch([&](int64_t i, float* dst) {
    const float* src = x + (plan.order[static_cast<size_t>(i)] / r.top_k) * d;
    std::copy(src, src + d, dst);
  });
  const std::vector<const float*> back = ex.combine();
  if (copy_back && ex.shared()) {
    float* to = md::scratch<float>(md::kSendBuffer, back.size() * static_cast<size_t>(d));
    for (size_t i = 0; i < back.size(); ++i) std::copy(back[i], back[i] + d, to + static_cast<int64_t>(i) * d);
  }
  if (third_barrier) world.shared_barrier();  // what one buffer instead of two halves would need
  return MPI_Wtime() - t0;
}

struct Series {
  std::vector<double> t, ratio;  // seconds; raw / it, per iteration
  void add(double time, double raw) { t.push_back(time), ratio.push_back(raw / time); }
};

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 2048, d = argc > 2 ? std::atoll(argv[2]) : 256;
  const int64_t f = argc > 3 ? std::atoll(argv[3]) : 512, E = argc > 4 ? std::atoll(argv[4]) : 8;
  const int64_t k = argc > 5 ? std::atoll(argv[5]) : 2;
  const int iters = argc > 6 ? std::atoi(argv[6]) : 20;
  return comm::run_mpi_main([&](comm::Communicator& world) {
    const int P = world.size(), me = world.rank();
    if (E % P != 0) throw std::runtime_error("experts must divide over the ranks");
    const int64_t local = E / P;
    Tensor x = random_tensor(Shape{n, d}, 100 + static_cast<uint64_t>(me), 1.0);
    Tensor gate = random_tensor(Shape{E, d}, 7, 0.1);
    ops::MoeConfig cfg{k, 0.0, true};
    ops::MoeShard shard{me * n, P * n, me * local, &world, &world};
    ops::moe_detail::Routing r = ops::moe_detail::route(x, gate, local, cfg, shard);
    std::vector<double> t_raw, t_moe, t_dense;
    Series shared, in_place, three_barriers, messages;
    int64_t rows_sent = 0, rows_received = 0;
    // Experts on one rank: all E experts, its n tokens.
    Tensor w1 = random_tensor(Shape{E, f, d}, 11, 0.05), w3 = random_tensor(Shape{E, f, d}, 12, 0.05);
    Tensor w2 = random_tensor(Shape{E, d, f}, 13, 0.05);
    Tensor dw1 = random_tensor(Shape{k * f, d}, 14, 0.05), dw3 = random_tensor(Shape{k * f, d}, 15, 0.05);
    Tensor dw2 = random_tensor(Shape{d, k * f}, 16, 0.05);
    std::vector<float> h1(static_cast<size_t>(n * k * f)), h3(h1.size()), y(static_cast<size_t>(n * d));
    std::vector<Tensor> moe_in{x, gate, w1, w3, w2};
    const float* xs = x.data<float>();
    for (int it = -2; it < iters; ++it) {
      // Raw MPI: the same counts, two Alltoallv.
      md::DispatchPlan plan = md::plan_dispatch(r, local, shard);
      rows_sent = static_cast<int64_t>(plan.order.size()), rows_received = md::total_rows(plan.recv_rows);
      std::vector<int> sc(static_cast<size_t>(P)), rc(sc.size()), sd(sc.size()), rd(sc.size());
      for (size_t p = 0; p < sc.size(); ++p) {
        sc[p] = static_cast<int>(plan.send_rows[p] * d), rc[p] = static_cast<int>(plan.recv_rows[p] * d);
        if (p > 0) sd[p] = sd[p - 1] + sc[p - 1], rd[p] = rd[p - 1] + rc[p - 1];
      }
      std::vector<float> raw_in(static_cast<size_t>(rows_sent * d)), raw_mid(static_cast<size_t>(rows_received * d)),
          raw_out(raw_in.size());
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      MPI_Alltoallv(raw_in.data(), sc.data(), sd.data(), MPI_FLOAT, raw_mid.data(), rc.data(), rd.data(), MPI_FLOAT,
                    MPI_COMM_WORLD);
      MPI_Alltoallv(raw_mid.data(), rc.data(), rd.data(), MPI_FLOAT, raw_out.data(), sc.data(), sd.data(), MPI_FLOAT,
                    MPI_COMM_WORLD);
      const double raw = slowest(MPI_Wtime() - t0);
      // The kernel's paths: shared (results copied back; read in place; with a third barrier), messages.
      comm::CheckedByCaller checked(&world);
      double t[4];
      const ops::MoeExchange kinds[4] = {ops::MoeExchange::Shared, ops::MoeExchange::Shared, ops::MoeExchange::Shared,
                                         ops::MoeExchange::Messages};
      for (int j = 0; j < 4; ++j) {  // in a rotating order: none always follows raw
        const int i = (j + it + 2) % 4;
        MPI_Barrier(MPI_COMM_WORLD);
        t[i] = slowest(dispatch_combine(world, r, local, shard, kinds[i], xs, d, i == 0, i == 2));
      }
      // Experts on one rank vs the dense MLP of equal active FLOPs.
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = MPI_Wtime();
      std::vector<Tensor> out = ops::moe_forward(moe_in, cfg, ops::MoeShard{});
      const double moe = slowest(MPI_Wtime() - t0);
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = MPI_Wtime();
      dense_mlp(x, dw1, dw3, dw2, h1, h3, y);
      const double dense = slowest(MPI_Wtime() - t0);
      if (it < 0) continue;
      t_raw.push_back(raw), t_moe.push_back(moe), t_dense.push_back(dense);
      shared.add(t[0], raw), in_place.add(t[1], raw), three_barriers.add(t[2], raw), messages.add(t[3], raw);
    }
    if (me == 0) {
      const double raw = median(t_raw);
      std::printf("%d ranks, %lld tokens a rank, hidden %lld, ffn %lld, %lld experts top-%lld, %d iterations\n", P,
                  static_cast<long long>(n), static_cast<long long>(d), static_cast<long long>(f),
                  static_cast<long long>(E), static_cast<long long>(k), iters);
      std::printf("rank 0 sends %lld rows, receives %lld (f32 rows of %lld)\n", static_cast<long long>(rows_sent),
                  static_cast<long long>(rows_received), static_cast<long long>(d));
      std::printf("raw MPI_Alltoallv x2, same counts: %9.1f us\n", raw * 1e6);
      auto line = [&](const char* what, const Series& s) {
        std::printf("%-62s %9.1f us, raw / it %.3f (median of per-iteration ratios %.3f)\n", what, median(s.t) * 1e6,
                    raw / median(s.t), median(s.ratio));
      };
      line("shared: write into the owners' regions, copy the results back:", shared);
      line("shared, the results read in place (the kernel's combine):", in_place);
      line("shared, in place, a third barrier (one buffer, not two halves):", three_barriers);
      line("messages: all_to_all_pieces both ways (pack overlapped):", messages);
      const double moe = median(t_moe), dense = median(t_dense);
      std::printf("moe_forward, all %lld experts on one rank's tokens: %9.1f us; dense SwiGLU of width %lld: %9.1f us; "
                  "dense / moe = %.3f\n",
                  static_cast<long long>(E), moe * 1e6, static_cast<long long>(k * f), dense * 1e6, dense / moe);
    }
  });
}
