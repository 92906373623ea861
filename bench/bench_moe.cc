// The MoE MLP's expert parallelism under MPI (issue 17; bench/moe.sh runs it, BENCHMARKS.md keeps
// the figures), every rank one ep rank of one expert group (the world), interleaved per iteration:
//
//   dispatch + combine: the kernel's plan (plan_dispatch: the counts came with the router's
//   all_gather, which both sides leave out), packing the kept rows, the all_to_all_pieces that
//   lands them expert-major and the inverse that returns them (ops/moe/dispatch.h, as moe_forward
//   runs them), against two raw MPI_Alltoallv of the same counts and the same bytes (preallocated
//   buffers, no packing); also the two exchanges alone, timed as the raw pair; with the mpi
//   backend's call checks (default: a 32-byte all-gather before each collective) and without.
//   experts: moe_forward on one rank's tokens with all E experts (router in double, grouped GEMMs,
//   combine) against a dense SwiGLU MLP of width top_k x F on the same tokens (equal active FLOPs).
//
//   mpirun -np 4 build/bench/bench_moe [tokens_per_rank] [hidden] [ffn] [experts] [top_k] [iters]
//
// Times are medians over iterations of the slowest rank's time.
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

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 2048, d = argc > 2 ? std::atoll(argv[2]) : 256;
  const int64_t f = argc > 3 ? std::atoll(argv[3]) : 512, E = argc > 4 ? std::atoll(argv[4]) : 8;
  const int64_t k = argc > 5 ? std::atoll(argv[5]) : 2;
  const int iters = argc > 6 ? std::atoi(argv[6]) : 20;
  return comm::run_mpi_main([&](comm::Communicator& world) {
    comm::MpiComm& mpi = *comm::mpi_world();
    const int P = world.size(), me = world.rank();
    if (E % P != 0) throw std::runtime_error("experts must divide over the ranks");
    const int64_t local = E / P;
    Tensor x = random_tensor(Shape{n, d}, 100 + static_cast<uint64_t>(me), 1.0);
    Tensor gate = random_tensor(Shape{E, d}, 7, 0.1);
    ops::MoeConfig cfg{k, 0.0, true};
    ops::MoeShard shard{me * n, P * n, me * local, &world, &world};
    ops::moe_detail::Routing r = ops::moe_detail::route(x, gate, local, cfg, shard);
    std::vector<double> t_ours[2], t_exchange[2], t_plan, t_pack, t_raw, t_raw_agree, t_moe, t_dense;
    int64_t rows_sent = 0, rows_received = 0;
    // Experts on one rank: all E experts, its n tokens.
    Tensor w1 = random_tensor(Shape{E, f, d}, 11, 0.05), w3 = random_tensor(Shape{E, f, d}, 12, 0.05);
    Tensor w2 = random_tensor(Shape{E, d, f}, 13, 0.05);
    Tensor dw1 = random_tensor(Shape{k * f, d}, 14, 0.05), dw3 = random_tensor(Shape{k * f, d}, 15, 0.05);
    Tensor dw2 = random_tensor(Shape{d, k * f}, 16, 0.05);
    std::vector<float> h1(static_cast<size_t>(n * k * f)), h3(h1.size()), y(static_cast<size_t>(n * d));
    std::vector<Tensor> moe_in{x, gate, w1, w3, w2};
    for (int it = -2; it < iters; ++it) {
     for (int checks = 0; checks < 2; ++checks) {
      mpi.set_checks(checks == 1);
      // Ours: plan, pack, dispatch (expert-major), combine.
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      ops::moe_detail::DispatchPlan plan = ops::moe_detail::plan_dispatch(r, local, shard);
      const double t1 = MPI_Wtime();
      float* send = ops::moe_detail::pack_rows<float>(plan, k, x.data<float>(), d);
      const double t2 = MPI_Wtime();
      float* rows = ops::moe_detail::exchange_rows<float>(&world, plan, send, d, true);
      ops::moe_detail::exchange_rows<float>(&world, plan, rows, d, false);
      const double ours = slowest(MPI_Wtime() - t0), plan_time = slowest(t1 - t0), pack_time = slowest(t2 - t1);
      // The two exchanges alone, back to back after one barrier as the raw pair (no skew from the
      // packing).
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = MPI_Wtime();
      rows = ops::moe_detail::exchange_rows<float>(&world, plan, send, d, true);
      ops::moe_detail::exchange_rows<float>(&world, plan, rows, d, false);
      const double exchanges = slowest(MPI_Wtime() - t0);
      if (it >= 0) t_ours[checks].push_back(ours), t_exchange[checks].push_back(exchanges);
      if (it >= 0) t_plan.push_back(plan_time), t_pack.push_back(pack_time);
      rows_sent = static_cast<int64_t>(plan.order.size()), rows_received = ops::moe_detail::total_rows(plan.recv_rows);
      if (checks == 0) continue;
      // Raw MPI: the same counts, two Alltoallv.
      std::vector<int> sc(static_cast<size_t>(P)), rc(sc.size()), sd(sc.size()), rd(sc.size());
      for (int p = 0; p < P; ++p) {
        sc[static_cast<size_t>(p)] = static_cast<int>(plan.send_rows[static_cast<size_t>(p)] * d);
        rc[static_cast<size_t>(p)] = static_cast<int>(plan.recv_rows[static_cast<size_t>(p)] * d);
        if (p > 0) sd[static_cast<size_t>(p)] = sd[static_cast<size_t>(p - 1)] + sc[static_cast<size_t>(p - 1)];
        if (p > 0) rd[static_cast<size_t>(p)] = rd[static_cast<size_t>(p - 1)] + rc[static_cast<size_t>(p - 1)];
      }
      std::vector<float> raw_in(static_cast<size_t>(rows_sent * d)), raw_mid(static_cast<size_t>(rows_received * d)),
          raw_out(raw_in.size());
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = MPI_Wtime();
      MPI_Alltoallv(raw_in.data(), sc.data(), sd.data(), MPI_FLOAT, raw_mid.data(), rc.data(), rd.data(), MPI_FLOAT,
                    MPI_COMM_WORLD);
      MPI_Alltoallv(raw_mid.data(), rc.data(), rd.data(), MPI_FLOAT, raw_out.data(), sc.data(), sd.data(), MPI_FLOAT,
                    MPI_COMM_WORLD);
      const double raw = slowest(MPI_Wtime() - t0);
      // The same with the one-int MPI_Allreduce the backend makes before each all_to_all_v (every
      // rank agrees whether some rank's counts leave the int range).
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = MPI_Wtime();
      for (int pass = 0; pass < 2; ++pass) {
        int large = 0;
        MPI_Allreduce(MPI_IN_PLACE, &large, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (pass == 0)
          MPI_Alltoallv(raw_in.data(), sc.data(), sd.data(), MPI_FLOAT, raw_mid.data(), rc.data(), rd.data(), MPI_FLOAT,
                        MPI_COMM_WORLD);
        else
          MPI_Alltoallv(raw_mid.data(), rc.data(), rd.data(), MPI_FLOAT, raw_out.data(), sc.data(), sd.data(), MPI_FLOAT,
                        MPI_COMM_WORLD);
      }
      const double raw_agree = slowest(MPI_Wtime() - t0);
      // Experts on one rank vs the dense MLP of equal active FLOPs.
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = MPI_Wtime();
      std::vector<Tensor> out = ops::moe_forward(moe_in, cfg, ops::MoeShard{});
      const double moe = slowest(MPI_Wtime() - t0);
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = MPI_Wtime();
      dense_mlp(x, dw1, dw3, dw2, h1, h3, y);
      const double dense = slowest(MPI_Wtime() - t0);
      if (it >= 0) t_raw.push_back(raw), t_raw_agree.push_back(raw_agree), t_moe.push_back(moe), t_dense.push_back(dense);
     }
    }
    mpi.set_checks(true);
    if (me == 0) {
      const double raw = median(t_raw);
      std::printf("%d ranks, %lld tokens a rank, hidden %lld, ffn %lld, %lld experts top-%lld, %d iterations\n", P,
                  static_cast<long long>(n), static_cast<long long>(d), static_cast<long long>(f),
                  static_cast<long long>(E), static_cast<long long>(k), iters);
      std::printf("rank 0 sends %lld rows, receives %lld (f32 rows of %lld)\n", static_cast<long long>(rows_sent),
                  static_cast<long long>(rows_received), static_cast<long long>(d));
      std::printf("raw MPI_Alltoallv x2, same counts: %9.1f us; each after a one-int MPI_Allreduce (the backend's path "
                  "agreement): %9.1f us\n",
                  raw * 1e6, median(t_raw_agree) * 1e6);
      for (int checks = 1; checks >= 0; --checks) {
        const double ours = median(t_ours[checks]), ex = median(t_exchange[checks]);
        std::printf("call checks %-3s: dispatch + combine (plan, pack, 2 all_to_all_pieces) %9.1f us, raw / ours "
                    "%.3f; the two all_to_all_pieces alone (back to back after a barrier) %9.1f us, raw / them %.3f\n",
                    checks ? "on" : "off", ours * 1e6, raw / ours, ex * 1e6, raw / ex);
      }
      std::printf("of which (slowest rank, both check settings): plan %9.1f us, pack %9.1f us\n", median(t_plan) * 1e6,
                  median(t_pack) * 1e6);
      const double moe = median(t_moe), dense = median(t_dense);
      std::printf("moe_forward, all %lld experts on one rank's tokens: %9.1f us; dense SwiGLU of width %lld: %9.1f us; "
                  "dense / moe = %.3f\n",
                  static_cast<long long>(E), moe * 1e6, static_cast<long long>(k * f), dense * 1e6, dense / moe);
    }
  });
}
