#include "shardwise/plan/cost.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "shardwise/core/error.h"
#include "shardwise/pipeline/simulate.h"

namespace shardwise::plan {

std::string collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::AllReduce: return "all_reduce";
    case CollectiveKind::AllGather: return "all_gather";
    case CollectiveKind::ReduceScatter: return "reduce_scatter";
    case CollectiveKind::AllToAll: return "all_to_all";
    case CollectiveKind::SendRecv: return "send_recv";
  }
  return "?";
}

std::string gemm_rate_dtype(bool bf16_operands, const std::string& dtype) {
  if (bf16_operands) return "bf16";
  return dtype == "bf16" ? "f32" : dtype;
}

double compute_seconds(const ClusterSpec& c, double flops, const std::string& dtype) {
  return flops / (c.peak(dtype) * c.factor("compute"));
}

double gemm_seconds(const ClusterSpec& c, double flops, const std::string& dtype, int64_t m, int64_t n, int64_t k) {
  const std::string measured = dtype == "tf32" ? "f32" : dtype;
  const GemmRate* nearest = nullptr;
  double best = 0;
  auto gap = [](int64_t a, int64_t b) { return std::abs(std::log(static_cast<double>(std::max<int64_t>(a, 1)) / static_cast<double>(b))); };
  for (const GemmRate& r : c.gemm_rates) {
    if (r.dtype != measured) continue;
    const double d = gap(m, r.m) + gap(n, r.n) + gap(k, r.k);
    if (nearest == nullptr || d < best) nearest = &r, best = d;
  }
  if (nearest == nullptr) return compute_seconds(c, flops, dtype);
  return flops / (nearest->flops_per_s * c.factor("compute"));
}

double memory_seconds(const ClusterSpec& c, double bytes) {
  return bytes / (c.memory_bandwidth * c.factor("memory"));
}

double fitted_seconds(const ClusterSpec& c, const std::string& type, double modelled) {
  auto it = c.kernel_fits.find(type);
  return it == c.kernel_fits.end() ? modelled : it->second.overhead_s + it->second.scale * modelled;
}

KernelFit fit_kernel(std::span<const KernelSample> samples) {
  double nn = 0, nm = 0, mm = 0, nt = 0, mt = 0;
  for (const KernelSample& s : samples) {
    SW_CHECK(s.count >= 0 && s.modelled >= 0 && s.measured >= 0, "fit_kernel: a sample with a negative part ({}, {}, {})",
             s.count, s.modelled, s.measured);
    nn += s.count * s.count, nm += s.count * s.modelled, mm += s.modelled * s.modelled;
    nt += s.count * s.measured, mt += s.modelled * s.measured;
  }
  SW_CHECK(nn > 0, "fit_kernel: no sample with an instruction that ran");
  const double det = nn * mm - nm * nm;
  KernelFit f{0, 0};
  if (det > 1e-12 * nn * mm) {  // both terms: the normal equations
    f.overhead_s = (nt * mm - mt * nm) / det;
    f.scale = (mt * nn - nt * nm) / det;
    if (f.overhead_s >= 0 && f.scale >= 0) return f;
  }
  // One term: the one that fits better alone (the other 0).
  const KernelFit only_overhead{std::max(0.0, nt / nn), 0};
  const KernelFit only_scale{0, mm > 0 ? std::max(0.0, mt / mm) : 0};
  auto residual = [&](const KernelFit& g) {
    double r = 0;
    for (const KernelSample& s : samples) {
      const double e = s.measured - s.count * g.overhead_s - s.modelled * g.scale;
      r += e * e;
    }
    return r;
  };
  return mm > 0 && residual(only_scale) < residual(only_overhead) ? only_scale : only_overhead;
}

double core_contention(const ClusterSpec& c, int64_t threads) {
  return c.cores > 0 && threads > c.cores ? static_cast<double>(threads) / static_cast<double>(c.cores) : 1.0;
}

double rank_factor(const ClusterSpec& c, int64_t ranks) {
  auto it = c.rank_factors.find(ranks);
  return it != c.rank_factors.end() ? it->second : core_contention(c, ranks);
}

double mesh_factor(const ClusterSpec& c, const std::string& mesh, int64_t ranks) {
  auto it = c.mesh_factors.find(mesh);
  return it != c.mesh_factors.end() ? it->second : rank_factor(c, ranks);
}

LinkSpec group_link(const ClusterSpec& c, std::span<const int> ranks) {
  SW_CHECK(!ranks.empty(), "group_link: an empty group");
  const int64_t node = ranks[0] / c.devices_per_node;
  bool one_node = true;
  for (int r : ranks) {
    SW_CHECK(r >= 0 && r < c.devices(), "group_link: rank {} is not among the {} devices of cluster '{}'", r,
             c.devices(), c.name);
    one_node = one_node && r / c.devices_per_node == node;
  }
  LinkSpec l = one_node ? c.intra_node : c.inter_node;
  l.bandwidth *= c.factor("network");
  return l;
}

namespace {
// (latency steps, bandwidth share of `bytes`) of a ring collective over p ranks.
std::pair<double, double> ring_terms(CollectiveKind kind, int p) {
  const double q = p - 1;
  switch (kind) {
    case CollectiveKind::AllReduce: return {2 * q, 2 * q / p};
    case CollectiveKind::SendRecv: return {1, 1};
    default: return {q, q / p};
  }
}
}  // namespace

double collective_seconds(CollectiveKind kind, double bytes, int ranks, const LinkSpec& link) {
  SW_CHECK(ranks >= 1, "collective_seconds: a group of {} ranks", ranks);
  SW_CHECK(bytes >= 0, "collective_seconds: {} bytes", bytes);
  if (ranks == 1 && kind != CollectiveKind::SendRecv) return 0;
  auto [steps, share] = ring_terms(kind, ranks);
  return steps * link.latency + share * bytes / link.bandwidth;
}

double ring_share(CollectiveKind kind, int ranks) { return ring_terms(kind, ranks).second; }

double group_collective_seconds(const ClusterSpec& c, CollectiveKind kind, double bytes, std::span<const int> group) {
  const int p = static_cast<int>(group.size());
  auto it = c.measured_collectives.find(collective_name(kind));
  const bool one_node = c.devices_per_node > 0 && !group.empty() &&
                        std::all_of(group.begin(), group.end(), [&](int r) { return r / c.devices_per_node == group[0] / c.devices_per_node; });
  if (p < 2 || it == c.measured_collectives.end() || it->second.ranks != p || it->second.points.size() < 2 || !one_node)
    return collective_seconds(kind, bytes, std::max(p, 1), group_link(c, group));
  const auto& pts = it->second.points;
  size_t i = 0;  // the segment [i, i + 1] around bytes, or the end one nearest it
  while (i + 2 < pts.size() && bytes > pts[i + 1].first) ++i;
  const auto [b0, t0] = pts[i];
  const auto [b1, t1] = pts[i + 1];
  return std::max(0.0, t0 + (t1 - t0) * (bytes - b0) / (b1 - b0));
}

AlphaBeta fit_alpha_beta(CollectiveKind kind, int ranks, double n1, double t1, double n2, double t2) {
  SW_CHECK(ranks >= 2 || kind == CollectiveKind::SendRecv, "fit_alpha_beta: {} over {} rank(s) moves nothing",
           collective_name(kind), ranks);
  SW_CHECK(n1 != n2, "fit_alpha_beta: the two message sizes must differ (both {} bytes)", n1);
  AlphaBeta f;
  f.b = (t2 - t1) / (n2 - n1);
  f.a = t1 - f.b * n1;
  auto [steps, share] = ring_terms(kind, ranks);
  if (f.b <= 0) {
    f.note = "the larger message was not slower: bandwidth taken as unbounded";
    f.link.bandwidth = std::numeric_limits<double>::infinity();
  } else {
    f.link.bandwidth = share / f.b;
  }
  if (f.a < 0) {
    f.note += std::string(f.note.empty() ? "" : "; ") + "negative intercept: latency taken as 0";
    f.link.latency = 0;
  } else {
    f.link.latency = f.a / steps;
  }
  return f;
}

namespace {
PipelineTime simulated(const pipeline::Schedule& s, int virtual_stages, double forward, double backward, double send) {
  using namespace pipeline;
  SimOptions sim;
  const double scale = 1.0 / virtual_stages;
  sim.stages = {StageCosts{forward * scale, backward * scale, backward * scale / 2, backward * scale / 2, 1, 0}};
  sim.send_time = send;
  SimResult r = simulate(s, sim);
  return {r.step_time, r.max_bubble_fraction()};
}
}  // namespace

PipelineTime pipeline_time(const std::string& schedule, int stages, int micro_batches, int virtual_stages,
                           double forward, double backward, double send) {
  PipelineTimer timer;
  return timer(schedule, stages, micro_batches, virtual_stages, forward, backward, send);
}

PipelineTime PipelineTimer::operator()(const std::string& schedule, int stages, int micro_batches, int virtual_stages,
                                       double forward, double backward, double send) {
  const auto key = std::make_tuple(schedule, stages, micro_batches, virtual_stages);
  auto it = schedules_.find(key);
  if (it == schedules_.end()) {
    it = schedules_.emplace(key, pipeline::make_schedule(pipeline::parse_schedule_kind(schedule), stages, micro_batches,
                                                          virtual_stages)).first;
  }
  return simulated(it->second, virtual_stages, forward, backward, send);
}

}  // namespace shardwise::plan
