// Ring attention's exchange (ops/attention/ring.h) on MPI processes against raw MPI send/recv of
// the same bytes (issue 35). One ring step moves this rank's k and v blocks to the next rank and
// takes the previous rank's: for a sequence of `seq` tokens split over the n ranks, one sequence,
// `heads` key/value heads of `head_dim`, f32, that is 2 * seq / n * heads * head_dim * 4 bytes
// each way. Per size, the median over iterations of the slowest rank's time of one step:
//   raw       MPI_Sendrecv of k, then of v (next rank, previous rank)
//   blocking  shardwise send / recv, even ranks sending first (the ring before the overlap)
//   started   shardwise start_send / start_recv of k and v, then the waits (the ring's Transfer)
// and of one forward ring_attention over the ring (n - 1 such steps, overlapped with the tiles)
// against its tiles alone (flash_attention of the local queries on a block, n times, no
// transfer): ring - tiles is the exchange time the overlap leaves exposed.
//
//   mpirun -np 2 build/bench/bench_ring_mpi [heads] [head_dim] [seq ...]   (bench/ring_exchange.sh)
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "shardwise/comm/mpi.h"
#include "shardwise/ops/attention/ring.h"

namespace {

using shardwise::DType;
using shardwise::Shape;
using shardwise::Tensor;
using shardwise::comm::MpiComm;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The median over `iters` (after one warm-up) of the slowest rank's time of fn.
double timed(int iters, const std::function<void()>& fn) {
  std::vector<double> times;
  for (int it = -1; it < iters; ++it) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    fn();
    double t = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (it >= 0) times.push_back(t);
  }
  return median(times);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t heads = argc > 1 ? std::atoll(argv[1]) : 4, dim = argc > 2 ? std::atoll(argv[2]) : 64;
  std::vector<int64_t> seqs;
  for (int i = 3; i < argc; ++i) seqs.push_back(std::atoll(argv[i]));
  if (seqs.empty()) seqs = {4096, 8192, 16384};
  return shardwise::comm::run_mpi_main([&](shardwise::comm::Communicator&) {
    MpiComm& comm = *shardwise::comm::mpi_world();
    const int n = comm.size(), me = comm.rank(), next = (me + 1) % n, prev = (me + n - 1) % n;
    if (me == 0) {
      std::printf("%d ranks, %lld heads of %lld, f32; one ring step: k and v each way; times in ms (slowest rank, median)\n",
                  n, static_cast<long long>(heads), static_cast<long long>(dim));
      std::printf("%7s %12s | %8s %8s %8s %7s | %9s %9s %9s\n", "seq", "step bytes", "raw", "blocking", "started",
                  "st/raw", "ring fwd", "tiles", "exposed");
    }
    for (int64_t seq : seqs) {
      const int64_t rows = seq / n;
      const Shape shape{1, heads, rows, dim};
      Tensor q = Tensor::full(DType::F32, shape, 0.01), k = Tensor::full(DType::F32, shape, 0.02),
             v = Tensor::full(DType::F32, shape, 0.03);
      Tensor gk = Tensor::uninitialized(DType::F32, shape), gv = Tensor::uninitialized(DType::F32, shape);
      const int count = static_cast<int>(k.numel());
      const int64_t step_bytes = 2 * k.numel() * 4;
      const int iters = static_cast<int>(std::clamp<int64_t>((int64_t{1} << 30) / step_bytes, 5, 50));
      const double raw = timed(iters, [&] {
        MPI_Sendrecv(k.raw(), count, MPI_FLOAT, next, 1, gk.raw(), count, MPI_FLOAT, prev, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Sendrecv(v.raw(), count, MPI_FLOAT, next, 2, gv.raw(), count, MPI_FLOAT, prev, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      });
      const double blocking = timed(iters, [&] {
        for (auto [from, to, tag] : {std::tuple{&k, &gk, 1}, std::tuple{&v, &gv, 2}}) {
          if (me % 2 == 0) comm.send(*from, next, tag), comm.recv(*to, prev, tag);
          else comm.recv(*to, prev, tag), comm.send(*from, next, tag);
        }
      });
      const double started = timed(iters, [&] {
        std::vector<std::unique_ptr<shardwise::comm::Request>> r;
        for (auto [from, to, tag] : {std::tuple{&k, &gk, 1}, std::tuple{&v, &gv, 2}}) {
          r.push_back(comm.start_send(from->raw(), from->numel(), DType::F32, next, tag));
          r.push_back(comm.start_recv(to->raw(), to->numel(), DType::F32, prev, tag));
        }
        for (auto& x : r) x->wait();
      });
      shardwise::ops::AttentionArgs args;
      args.scale = 0.125;
      shardwise::ops::AttentionCoords at;
      at.query0 = rows * me, at.seq = rows * n;
      const int fwd_iters = 3;
      const double ring = timed(fwd_iters, [&] { shardwise::ops::ring_attention(q, k, v, Tensor(), args, at, &comm); });
      const double tiles = timed(fwd_iters, [&] {
        for (int t = 0; t < n; ++t) {
          shardwise::ops::AttentionCoords tile = at;
          tile.key0 = rows * ((me + n - t) % n);
          shardwise::ops::flash_attention(q, k, v, Tensor(), args, tile);
        }
      });
      if (me == 0) {
        std::printf("%7lld %12lld | %8.2f %8.2f %8.2f %7.2f | %9.1f %9.1f %9.1f\n", static_cast<long long>(seq),
                    static_cast<long long>(step_bytes), raw * 1e3, blocking * 1e3, started * 1e3, started / raw,
                    ring * 1e3, tiles * 1e3, (ring - tiles) * 1e3);
        std::fflush(stdout);
      }
    }
  });
}
