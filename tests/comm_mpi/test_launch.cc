// Runs tests/comm_mpi/helper_main.cc under mpirun, as a user would, and checks how the job ends.
// The only time limit is a generous liveness bound (timeout 60 s): a job that hangs fails here.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <sys/wait.h>

namespace {

struct Job {
  int status = -1;  // exit status of the job (124: killed by the liveness bound)
  std::string output;  // stdout and stderr
};

Job run_job(int ranks, const std::string& mode) {
  // The mpirun line and the helper's path come from CMake (tests/CMakeLists.txt).
  std::string command = std::string("timeout -k 5 60 ") + SHARDWISE_MPIRUN_LINE + " -np " + std::to_string(ranks) +
                        " " + SHARDWISE_MPI_HELPER + " " + mode + " 2>&1";
  Job job;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) {
    ADD_FAILURE() << "cannot run " << command;
    return job;
  }
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) job.output.append(buffer, n);
  int raw = pclose(pipe);
  job.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  return job;
}

TEST(MpiLaunch, ASuccessfulJobExitsWithZero) {
  Job job = run_job(2, "ok");
  EXPECT_EQ(job.status, 0) << job.output;
  EXPECT_NE(job.output.find("sum of ranks: 1"), std::string::npos) << job.output;
}

TEST(MpiLaunch, AFailingRankEndsTheJobWithItsMessageInsteadOfAHang) {
  Job job = run_job(2, "fail");
  EXPECT_NE(job.status, 124) << "the job hung until the liveness bound:\n" << job.output;
  EXPECT_NE(job.status, 0) << job.output;
  EXPECT_NE(job.output.find("shardwise: error: rank 1: rank one broke"), std::string::npos) << job.output;
}

TEST(MpiLaunch, AMismatchedCollectiveEndsTheJobWithBothCalls) {
  Job job = run_job(3, "mismatch");
  EXPECT_NE(job.status, 124) << "the job hung until the liveness bound:\n" << job.output;
  EXPECT_NE(job.status, 0) << job.output;
  EXPECT_NE(job.output.find("shardwise: error: rank "), std::string::npos) << job.output;
  EXPECT_NE(job.output.find("collective mismatch: rank 0 called broadcast while rank 1 called all_reduce"),
            std::string::npos) << job.output;
}

}  // namespace
