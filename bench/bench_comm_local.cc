// Bandwidth of the local backend's all_reduce and all_gather (ranks = threads of this process)
// against a plain memcpy of the same bytes, the physical limit for threads sharing memory.
//
//   build/bench/bench_comm_local [max_bytes]      (bench/run_comm.sh runs it)
//
// `bytes` is the all_reduce buffer, and the gathered output of all_gather. algbw = bytes / time;
// memcpy = one thread copying `bytes` bytes from one buffer to another. Medians over iterations.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "shardwise/comm/local.h"

namespace {

using Clock = std::chrono::steady_clock;
using shardwise::DType;
using shardwise::comm::Communicator;
using shardwise::comm::LocalWorld;
using shardwise::comm::Reduce;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int iterations(int64_t bytes) { return static_cast<int>(std::clamp<int64_t>((int64_t{1} << 29) / bytes, 5, 200)); }

double memcpy_seconds(int64_t bytes) {
  std::vector<char> a(static_cast<size_t>(bytes), 1), b(static_cast<size_t>(bytes), 0);
  std::vector<double> t;
  for (int it = -2; it < iterations(bytes); ++it) {
    auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), a.size());
    asm volatile("" : : "r"(b.data()) : "memory");  // keep the copy
    if (it >= 0) t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return median(t);
}

// Rank 0's time from a barrier to the end of the collective (which ends in a rendezvous).
double collective_seconds(int n, bool gather, int64_t bytes) {
  std::vector<double> t;
  LocalWorld::run(n, [&](Communicator& c) {
    int64_t count = bytes / 4;
    std::vector<float> in(static_cast<size_t>(gather ? count / n : count), 1.0f), out(static_cast<size_t>(count));
    for (int it = -2; it < iterations(bytes); ++it) {
      c.barrier();
      auto t0 = Clock::now();
      if (gather) c.all_gather(in.data(), out.data(), count / n, DType::F32);
      else c.all_reduce(in.data(), out.data(), count, DType::F32, Reduce::Sum);
      if (c.rank() == 0 && it >= 0) t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
  });
  return median(t);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t max_bytes = argc > 1 ? std::atoll(argv[1]) : int64_t{64} << 20;
  std::printf("GB/s = 1e9 bytes/s; ratio = collective algbw / memcpy bandwidth of the same bytes\n");
  std::printf("%-10s %7s %10s | %9s %9s | %9s %6s\n", "op", "threads", "bytes", "us", "algbw", "memcpy", "ratio");
  for (bool gather : {false, true}) {
    for (int n : {2, 4}) {
      for (int64_t bytes = 1024; bytes <= max_bytes; bytes *= 4) {
        double t = collective_seconds(n, gather, bytes), copy = memcpy_seconds(bytes);
        double algbw = static_cast<double>(bytes) / t / 1e9, copybw = static_cast<double>(bytes) / copy / 1e9;
        std::printf("%-10s %7d %10lld | %9.1f %9.3f | %9.3f %6.3f\n", gather ? "all_gather" : "all_reduce", n,
                    static_cast<long long>(bytes), t * 1e6, algbw, copybw, algbw / copybw);
        std::fflush(stdout);
      }
    }
  }
}
