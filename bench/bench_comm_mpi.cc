// Bus bandwidth of all_reduce, all_gather, reduce_scatter and all_to_all through shardwise's mpi
// backend (call checks on and off) against the same MPI calls made directly, interleaved in one run.
//
//   mpirun -np 2 build/bench/bench_comm_mpi [max_bytes]      (bench/run_comm.sh runs it)
//
// Sizes are nccl-tests' sizes: all_reduce the buffer, all_gather the gathered output,
// reduce_scatter the input, all_to_all what one rank sends; f32 elements, 1 KiB ... max_bytes
// (default 256 MiB) in powers of 4. algbw = size / time; busbw = algbw * 2(n-1)/n (all_reduce) or
// (n-1)/n (the others). Each figure is the median over iterations of the slowest rank's time.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "shardwise/comm/mpi.h"

namespace {

using shardwise::DType;
using shardwise::comm::MpiComm;
using shardwise::comm::Reduce;

enum class Op { AllReduce, AllGather, ReduceScatter, AllToAll };
constexpr Op kOps[] = {Op::AllReduce, Op::AllGather, Op::ReduceScatter, Op::AllToAll};
const char* name(Op op) {
  switch (op) {
    case Op::AllReduce: return "all_reduce";
    case Op::AllGather: return "all_gather";
    case Op::ReduceScatter: return "reduce_scatter";
    case Op::AllToAll: return "all_to_all";
  }
  return "?";
}

// One call of `op` on `bytes` (nccl-tests' size) through raw MPI or through `comm`.
void run_raw(Op op, const float* in, float* out, int64_t bytes, int n) {
  int count = static_cast<int>(bytes / 4), block = count / n;
  switch (op) {
    case Op::AllReduce: MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case Op::AllGather: MPI_Allgather(in, block, MPI_FLOAT, out, block, MPI_FLOAT, MPI_COMM_WORLD); break;
    case Op::ReduceScatter: MPI_Reduce_scatter_block(in, out, block, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case Op::AllToAll: MPI_Alltoall(in, block, MPI_FLOAT, out, block, MPI_FLOAT, MPI_COMM_WORLD); break;
  }
}

void run_shardwise(MpiComm& comm, Op op, const float* in, float* out, int64_t bytes, int n) {
  int64_t count = bytes / 4, block = count / n;
  switch (op) {
    case Op::AllReduce: comm.all_reduce(in, out, count, DType::F32, Reduce::Sum); break;
    case Op::AllGather: comm.all_gather(in, out, block, DType::F32); break;
    case Op::ReduceScatter: comm.reduce_scatter(in, out, block, DType::F32, Reduce::Sum); break;
    case Op::AllToAll: comm.all_to_all(in, out, block, DType::F32); break;
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t max_bytes = argc > 1 ? std::atoll(argv[1]) : int64_t{256} << 20;
  return shardwise::comm::run_mpi_main([&](shardwise::comm::Communicator&) {
    MpiComm& comm = *shardwise::comm::mpi_world();
    const int n = comm.size(), me = comm.rank();
    std::vector<float> in(static_cast<size_t>(max_bytes / 4), 1.0f), out(in.size(), 0.0f);
    if (me == 0) {
      std::printf("%d ranks; busbw in GB/s (1e9 bytes/s), time in us; ratio = shardwise busbw / raw MPI busbw\n", n);
      std::printf("%-14s %10s | %9s %9s | %9s %9s %6s | %9s %9s %6s\n", "op", "bytes", "raw us", "raw bus",
                  "chk us", "chk bus", "ratio", "nochk us", "nochk bus", "ratio");
    }
    for (Op op : kOps) {
      for (int64_t bytes = 1024; bytes <= max_bytes; bytes *= 4) {
        int iters = static_cast<int>(std::clamp<int64_t>((int64_t{1} << 30) / bytes, 5, 200));
        std::vector<double> times[3];
        for (int it = -2; it < iters; ++it) {  // two warm-up rounds
          for (int variant = 0; variant < 3; ++variant) {
            comm.set_checks(variant == 1);
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            if (variant == 0) run_raw(op, in.data(), out.data(), bytes, n);
            else run_shardwise(comm, op, in.data(), out.data(), bytes, n);
            double t = MPI_Wtime() - t0;
            MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            if (it >= 0) times[variant].push_back(t);
          }
        }
        double factor = (op == Op::AllReduce ? 2.0 : 1.0) * (n - 1) / n;
        double bus[3], us[3];
        for (int v = 0; v < 3; ++v) {
          double t = median(times[v]);
          us[v] = t * 1e6;
          bus[v] = static_cast<double>(bytes) / t / 1e9 * factor;
        }
        if (me == 0) {
          std::printf("%-14s %10lld | %9.1f %9.3f | %9.1f %9.3f %6.3f | %9.1f %9.3f %6.3f\n", name(op),
                      static_cast<long long>(bytes), us[0], bus[0], us[1], bus[1], bus[1] / bus[0], us[2], bus[2],
                      bus[2] / bus[0]);
          std::fflush(stdout);
        }
      }
    }
    comm.set_checks(true);
  });
}
