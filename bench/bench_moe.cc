// The MoE MLP's expert parallelism under MPI (issue 17; bench/moe.sh runs it, BENCHMARKS.md keeps
// the figures), every rank one ep rank of one expert group (the world), interleaved per iteration:
//
//   dispatch + combine, as moe_forward runs them (ops/moe/dispatch.h): the plan (plan_dispatch:
//   the counts came with the router's all_gather, which both sides leave out), dispatch_rows (each
//   peer's kept rows packed just before their messages leave, this rank's own straight into
//   place; all_to_all_pieces lands them expert-major) and combine_rows, against two raw
//   MPI_Alltoallv of the same counts and the same bytes (preallocated buffers, no packing). Also
//   the former order, every row packed first and then the two exchanges (the pack and the
//   exchanges timed apart), once with the exchanges' call checks skipped as the kernel does
//   (CheckedByCaller) and once with them (the backend's default outside a kernel's scope).
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

// The former dispatch + combine: every kept row packed in send order first, then the two
// all_to_all_pieces (self pieces copied by the backend); returns (pack, exchanges) seconds.
std::pair<double, double> pack_then_exchange(comm::Communicator& world, const md::DispatchPlan& plan, int64_t top_k,
                                             const float* x, int64_t d, bool checked_by_caller) {
  const double t0 = MPI_Wtime();
  float* send = md::scratch<float>(md::kSendBuffer, plan.order.size() * static_cast<size_t>(d));
  for (size_t i = 0; i < plan.order.size(); ++i) {
    const float* src = x + (plan.order[i] / top_k) * d;
    std::copy(src, src + d, send + static_cast<int64_t>(i) * d);
  }
  const double t1 = MPI_Wtime();
  float* rows = md::scratch<float>(md::kExpertRows, static_cast<size_t>(md::total_rows(plan.recv_rows) * d));
  const md::RowPieces senders = md::send_order(plan, d), experts = md::expert_major(plan, d);
  comm::CheckedByCaller checked(checked_by_caller ? &world : nullptr);
  world.all_to_all_pieces(send, senders.view(), rows, experts.view(), DType::F32);
  world.all_to_all_pieces(rows, experts.view(), send, senders.view(), DType::F32);
  return {t1 - t0, MPI_Wtime() - t1};
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
    std::vector<double> t_raw, t_moe, t_dense, t_plan, t_pack, t_exchanges[2];
    Series ours, former[2];
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
      // Ours, as moe_forward: plan, dispatch (pack overlapped, expert-major), combine.
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = MPI_Wtime();
      plan = md::plan_dispatch(r, local, shard);
      const double t1 = MPI_Wtime();
      float* rows = md::dispatch_rows<float>(&world, plan, d, [&](int64_t i, float* dst) {
        const float* src = xs + (plan.order[static_cast<size_t>(i)] / k) * d;
        std::copy(src, src + d, dst);
      });
      md::combine_rows<float>(&world, plan, rows, d);
      const double whole = slowest(MPI_Wtime() - t0), plan_time = slowest(t1 - t0);
      // The former order: pack everything, then the exchanges; with the kernel's scope, then
      // with the call checks.
      double former_time[2], pack_time = 0;
      for (int checks = 0; checks < 2; ++checks) {
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        auto [pack, exchanges] = pack_then_exchange(world, plan, k, xs, d, checks == 0);
        former_time[checks] = slowest(MPI_Wtime() - t0);
        if (checks == 0) pack_time = slowest(pack);
        const double exchange_time = slowest(exchanges);
        if (it >= 0) t_exchanges[checks].push_back(exchange_time);
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
      t_raw.push_back(raw), t_moe.push_back(moe), t_dense.push_back(dense), t_plan.push_back(plan_time);
      t_pack.push_back(pack_time);
      ours.add(whole, raw), former[0].add(former_time[0], raw), former[1].add(former_time[1], raw);
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
      line("dispatch + combine (plan, dispatch_rows, combine_rows):", ours);
      line("former: pack all, then 2 all_to_all_pieces, checks skipped:", former[0]);
      line("former: pack all, then 2 all_to_all_pieces, call checks on:", former[1]);
      std::printf("of which: plan %.1f us; former pack %.1f us, its exchanges %.1f us (raw / them %.3f), with call "
                  "checks %.1f us (%.3f)\n",
                  median(t_plan) * 1e6, median(t_pack) * 1e6, median(t_exchanges[0]) * 1e6,
                  raw / median(t_exchanges[0]), median(t_exchanges[1]) * 1e6, raw / median(t_exchanges[1]));
      const double moe = median(t_moe), dense = median(t_dense);
      std::printf("moe_forward, all %lld experts on one rank's tokens: %9.1f us; dense SwiGLU of width %lld: %9.1f us; "
                  "dense / moe = %.3f\n",
                  static_cast<long long>(E), moe * 1e6, static_cast<long long>(k * f), dense * 1e6, dense / moe);
    }
  });
}
