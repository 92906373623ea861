#include "shardwise/plan/calibrate.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <sched.h>
#include <unistd.h>

#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"
#include "shardwise/core/timing.h"
#include "shardwise/ops/op.h"
#include "shardwise/plan/cluster.h"
#include "shardwise/plan/cost.h"
#include "shardwise/tensor/gemm.h"

namespace shardwise::plan {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// GEMMs of a training step's kind: tokens x hidden by hidden x 4 hidden (MLP up), its transpose
// (MLP down) and an attention-score block, at GPT-2-small sizes and at a small model's (hidden 256
// and 128, a head of 32); quick: a tiny model's. The prediction times each GEMM at the nearest
// shape's rate (plan/cost.h gemm_seconds).
json measure_gemm(const CalibrateOptions& o, std::map<std::string, double>& peaks) {
  struct S { int64_t m, n, k; };
  std::vector<S> shapes = o.quick ? std::vector<S>{{64, 128, 32}, {64, 32, 128}}
                                  : std::vector<S>{{512, 3072, 768}, {512, 768, 3072}, {512, 512, 64},
                                                   {512, 256, 256}, {512, 1024, 256}, {512, 256, 1024},
                                                   {512, 128, 128}, {128, 128, 32}};
  json out = json::array();
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (const S& s : shapes) {
      Tensor a = Tensor::full(dtype, Shape{s.m, s.k}, 0.5), b = Tensor::full(dtype, Shape{s.k, s.n}, 0.25);
      double t = median_seconds(o.quick ? 1 : 5, [&] { (void)gemm(a, b); });
      double rate = 2.0 * s.m * s.n * s.k / t;
      SW_CHECK(rate > 0 && std::isfinite(rate), "calibrate: the GEMM measurement gave {} FLOP/s", rate);
      std::string name(dtype_name(dtype));
      out.push_back({{"dtype", name}, {"m", s.m}, {"n", s.n}, {"k", s.k}, {"seconds", t}, {"flops_per_s", rate}});
      peaks[name] = std::max(peaks[name], rate);
    }
  }
  peaks["tf32"] = peaks["f32"];
  return out;
}

json measure_memory(const CalibrateOptions& o) {
  const int64_t n = o.quick ? (1 << 18) : (1 << 24);  // 64 MB a tensor: well beyond the caches
  Tensor x = Tensor::full(DType::F32, Shape{n}, 1.0), y = Tensor::full(DType::F32, Shape{n}, 2.0);
  const ops::OpDef& add = ops::op_registry().get("add");
  std::vector<Tensor> in{x, y};
  double t = median_seconds(o.quick ? 1 : 5, [&] { (void)ops::run_forward(add, in, {}); });
  const double bytes = 3.0 * n * 4;
  return {{"op", "add"}, {"elements", n}, {"bytes", bytes}, {"seconds", t}, {"bytes_per_s", bytes / t}};
}

// Rank 0's seconds of `reps` calls of `kind` on `c` with a per-rank buffer of `bytes`, each started
// after a barrier, after one warm-up call (every rank returns its own; the median is taken of rank
// 0's: a collective waits for every rank to be scheduled, which on a shared machine is part of
// what it costs).
std::vector<double> collective_times(comm::Communicator& c, CollectiveKind kind, int64_t bytes, int reps) {
  std::vector<double> times;
  const int64_t count = bytes / 4;
  const int ranks = c.size();
  std::vector<float> in(static_cast<size_t>(count), 1.0f), out(static_cast<size_t>(count), 0.0f);
  for (int r = 0; r <= reps; ++r) {
    c.barrier();
    auto t0 = Clock::now();
    switch (kind) {
      case CollectiveKind::AllReduce: c.all_reduce(in.data(), out.data(), count, DType::F32, comm::Reduce::Sum); break;
      case CollectiveKind::AllGather: c.all_gather(in.data(), out.data(), count / ranks, DType::F32); break;
      case CollectiveKind::ReduceScatter:
        c.reduce_scatter(in.data(), out.data(), count / ranks, DType::F32, comm::Reduce::Sum);
        break;
      case CollectiveKind::AllToAll: c.all_to_all(in.data(), out.data(), count / ranks, DType::F32); break;
      case CollectiveKind::SendRecv: break;
    }
    if (r > 0) times.push_back(seconds_since(t0));  // r = 0: the warm-up
  }
  return times;
}

// The message sizes each collective is measured at (bytes a rank): a small one for the latency, the
// tensor-parallel all-reduces' size of the benchmark's steps, and a large one for the bandwidth.
std::vector<double> collective_sizes(bool quick) {
  return quick ? std::vector<double>{4096, 1 << 16, 1 << 18} : std::vector<double>{4096, 1 << 19, 1 << 24};
}

// Each collective on `c` at collective_sizes: {kind: {ranks, points: [[bytes, seconds] ...], a, b,
// latency, bandwidth, note}}, the line through the smallest and the largest point inverted through
// the ring formula (plan/cost.h). Every rank of `c` must call it; rank 0's times are the ones kept.
// `measure` runs one timing on every rank and returns rank 0's times.
template <class Measure>
json measure_collectives_with(bool quick, int ranks, int reps, Measure measure, LinkSpec& all_reduce_link) {
  const std::vector<double> sizes = collective_sizes(quick);
  json out = json::object();
  for (auto kind : {CollectiveKind::AllReduce, CollectiveKind::AllGather, CollectiveKind::ReduceScatter,
                    CollectiveKind::AllToAll}) {
    json points = json::array();
    std::vector<double> t;
    for (double n : sizes) {
      t.push_back(median_of(measure(kind, static_cast<int64_t>(n), reps)));
      points.push_back({n, t.back()});
    }
    AlphaBeta f = fit_alpha_beta(kind, ranks, sizes.front(), t.front(), sizes.back(), t.back());
    if (const std::string noisy = noisy_collective_note(sizes, t); !noisy.empty())
      f.note = f.note.empty() ? noisy : f.note + "; " + noisy;
    if (kind == CollectiveKind::AllReduce) all_reduce_link = f.link;
    out[collective_name(kind)] = {{"ranks", ranks}, {"points", points}, {"a", f.a}, {"b", f.b},
                                  {"latency", f.link.latency}, {"bandwidth", f.link.bandwidth}, {"note", f.note}};
  }
  return out;
}

}  // namespace

std::string noisy_collective_note(const std::vector<double>& bytes, const std::vector<double>& seconds) {
  if (!seconds.empty() && seconds.front() > 1e-3)
    return fmt::format("measured noisily ({:.0f} B took {:.1f} ms): calibrate again on a quiet machine", bytes.front(),
                       1e3 * seconds.front());
  for (size_t i = 1; i < seconds.size(); ++i)
    if (seconds[i] < 0.5 * seconds[i - 1])
      return fmt::format("measured noisily ({:.0f} B took {:.3g} ms, {:.0f} B {:.3g} ms): calibrate again on a quiet machine",
                         bytes[i - 1], 1e3 * seconds[i - 1], bytes[i], 1e3 * seconds[i]);
  return "";
}

namespace {

json measure_collectives(const CalibrateOptions& o, LinkSpec& all_reduce_link) {
  auto threads = [&](CollectiveKind kind, int64_t bytes, int reps) {
    std::vector<double> rank0;
    comm::LocalWorld::run(o.ranks, [&](comm::Communicator& c) {
      std::vector<double> t = collective_times(c, kind, bytes, reps);
      if (c.rank() == 0) rank0 = std::move(t);
    });
    return rank0;
  };
  return measure_collectives_with(o.quick, o.ranks, o.quick ? 2 : 9, threads, all_reduce_link);
}

// The cores this process may run on (its affinity mask; the ranks' threads share them).
int64_t available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max<int64_t>(1, std::thread::hardware_concurrency());
}

}  // namespace

json calibrate_mpi_collectives(comm::Communicator& world, bool quick) {
  SW_CHECK(world.size() >= 2, "calibrate: MPI's collectives need at least 2 processes (mpirun -np 2), got {}",
           world.size());
  set_blas_threads(1);
  auto mpi = [&](CollectiveKind kind, int64_t bytes, int reps) { return collective_times(world, kind, bytes, reps); };
  LinkSpec link;
  json collectives = measure_collectives_with(quick, world.size(), quick ? 2 : 9, mpi, link);
  if (!std::isfinite(link.bandwidth)) link.bandwidth = 1e15;  // unmeasurably fast: a finite stand-in
  return {{"ranks", world.size()}, {"collectives", collectives},
          {"link", {{"bandwidth", link.bandwidth}, {"latency", std::max(0.0, link.latency)}}}};
}

json calibrate_machine(const CalibrateOptions& o) {
  SW_CHECK(o.ranks >= 2 && o.ranks <= 64, "calibrate: --ranks {} (the collectives need 2 to 64 ranks)", o.ranks);
  set_blas_threads(1);  // one device = one rank with one kernel thread, as train runs them
  ClusterSpec c;
  c.name = "this machine (shardwise calibrate)";
  c.devices_per_node = o.ranks;
  json cal = {{"quick", o.quick}, {"cores", available_cores()}};
  cal["gemm"] = measure_gemm(o, c.peak_flops);
  cal["memory"] = measure_memory(o);
  c.memory_bandwidth = cal["memory"]["bytes_per_s"].get<double>();
  LinkSpec link;
  cal["collectives"] = measure_collectives(o, link);
  if (!std::isfinite(link.bandwidth)) link.bandwidth = 1e15;  // unmeasurably fast: a finite stand-in
  if (link.latency <= 0) link.latency = 0;
  c.intra_node = c.inter_node = link;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  c.memory_bytes = static_cast<double>(pages) * static_cast<double>(page) / o.ranks;
  c.sources = {{"device.peak_flops", "calibration.gemm: the best measured rate per dtype (tf32: the f32 rate)"},
               {"device.memory_bandwidth", "calibration.memory: the add op over large tensors"},
               {"device.memory_bytes", "the machine's physical memory shared by devices_per_node ranks"},
               {"links.intra_node", "calibration.collectives.all_reduce: the alpha-beta fit"},
               {"links.inter_node", "one node: the intra-node link (nothing else measured)"}};
  json j = cluster_json(c);
  j["calibration"] = cal;
  return j;
}

}  // namespace shardwise::plan
