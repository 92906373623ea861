// A small MPI program for tests/comm_mpi/test_launch.cc, run under mpirun:
//   ok        every rank adds its rank; rank 0 prints "sum of ranks: S"
//   fail      rank 1 throws while the others wait for a message from it that never comes
//   mismatch  rank 0 broadcasts while the others all-reduce
#include <cstdio>
#include <string>

#include "shardwise/comm/mpi.h"
#include "shardwise/core/error.h"

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "ok";
  return shardwise::comm::run_mpi_main([&](shardwise::comm::Communicator& c) {
    using shardwise::DType;
    int64_t x = c.rank(), sum = 0;
    if (mode == "ok") {
      c.all_reduce(&x, &sum, 1, DType::I64, shardwise::comm::Reduce::Sum);
      if (c.rank() == 0) std::printf("sum of ranks: %lld\n", static_cast<long long>(sum));
    } else if (mode == "fail") {
      c.barrier();
      if (c.rank() == 1) throw shardwise::Error("rank one broke");
      c.recv(&x, 1, DType::I64, 1);  // rank 1 never sends: only the abort ends this wait
    } else if (mode == "mismatch") {
      if (c.rank() == 0) c.broadcast(&x, 1, DType::I64, 0);
      else c.all_reduce(&x, &sum, 1, DType::I64, shardwise::comm::Reduce::Sum);
    } else {
      throw shardwise::Error("unknown mode '" + mode + "' (allowed: ok, fail, mismatch)");
    }
  });
}
