// GoogleTest on every rank of an mpirun job (ctest runs it with 2 and 4 processes). Rank 0 prints
// the usual report; the other ranks print only their failures, prefixed with their rank. Every
// rank exits with the job's verdict.
#include <gtest/gtest.h>

#include <cstdio>

#include "shardwise/comm/mpi.h"

namespace {

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, result.file_name() ? result.file_name() : "?",
                 result.line_number(), result.message());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  auto world = shardwise::comm::mpi_world();  // initializes MPI; finalized at exit
  ::testing::InitGoogleTest(&argc, argv);
  if (world->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(world->rank()));
  }
  int failed = RUN_ALL_TESTS() != 0;
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, world->native());
  return failed;
}
