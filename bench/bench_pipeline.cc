// Pipeline (issue 8): for each schedule, a real pipelined training run on pp=2 (two ranks as
// threads, BLAS single-threaded): the measured bubble (idle time per rank / step time) next to the
// simulator's for the same measured action times (a replay of every action's measured duration,
// and the stages' mean forward, backward, input-gradient and weight-gradient times), and the peak
// activation bytes per rank with and without release. Prints a markdown table; BENCHMARKS.md
// records it.
//   build/bench/bench_pipeline [steps=4] [layers=8] [hidden=128] [seq=64]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

#include "shardwise/comm/local.h"
#include "shardwise/pipeline/simulate.h"
#include "shardwise/tensor/gemm.h"
#include "shardwise/train/trainer.h"

using namespace shardwise;

namespace {

struct Measured {
  double step = 0;                      // max over ranks of the last action's end, median step
  std::vector<double> idle;             // per rank
  std::vector<std::vector<double>> durations;  // per rank, per action of the median step (receives: 0)
  std::vector<int64_t> peak;            // per rank
  pipeline::Schedule schedule;
  std::vector<pipeline::StageCosts> costs;
  double send = 0;
};

Measured run(const std::string& schedule, bool release, int steps, train::TrainConfig c) {
  c.parallel.schedule = schedule;
  c.parallel.virtual_stages = schedule == "interleaved" ? 2 : 1;
  c.parallel.pipeline_release = release;
  c.optimizer.steps = steps + 1;
  c.check(2);
  Measured m;
  std::mutex mu;
  std::vector<std::vector<pipeline::StepStats>> stats(2);  // per rank, per measured step
  comm::LocalWorld::run(2, [&](comm::Communicator& world) {
    train::Trainer t(c, world.group(world.members()));
    t.step();  // warm-up: allocations, first-touch
    std::vector<pipeline::StepStats> mine;
    for (int s = 0; s < steps; ++s) {
      t.step();
      mine.push_back(t.stages().last_stats());
    }
    std::lock_guard lock(mu);
    stats[static_cast<size_t>(world.rank())] = std::move(mine);
    if (world.rank() == 0) m.schedule = t.stages().schedule();
  });
  // The median step (by the slower rank's step time).
  std::vector<std::pair<double, int>> steps_by_time;
  for (int s = 0; s < steps; ++s)
    steps_by_time.push_back({std::max(stats[0][static_cast<size_t>(s)].seconds, stats[1][static_cast<size_t>(s)].seconds), s});
  std::sort(steps_by_time.begin(), steps_by_time.end());
  const auto median = static_cast<size_t>(steps_by_time[steps_by_time.size() / 2].second);
  m.step = steps_by_time[steps_by_time.size() / 2].first;
  // Mean action times per stage over all measured steps; peak bytes of the median step.
  const int S = m.schedule.stages();
  std::vector<std::map<pipeline::ActionKind, std::pair<double, int>>> sums(static_cast<size_t>(S));
  std::vector<double> sends;
  m.costs.assign(static_cast<size_t>(S), pipeline::StageCosts{});
  for (int r = 0; r < 2; ++r) {
    for (const pipeline::StepStats& st : stats[static_cast<size_t>(r)]) {
      for (const pipeline::ActionTime& a : st.timeline) {
        if (pipeline::is_send(a.action.kind)) sends.push_back(a.end - a.start);
        if (!pipeline::is_compute(a.action.kind)) continue;
        auto& e = sums[static_cast<size_t>(a.action.stage)][a.action.kind];
        e.first += a.end - a.start, ++e.second;
      }
    }
    const pipeline::StepStats& st = stats[static_cast<size_t>(r)][median];
    m.idle.push_back(m.step - st.compute_seconds);
    m.durations.emplace_back();
    for (const pipeline::ActionTime& a : st.timeline)
      m.durations.back().push_back(pipeline::is_recv(a.action.kind) ? 0.0 : a.end - a.start);
    m.peak.push_back(st.peak_activation_bytes);
    for (auto [stage, bytes] : st.forward_bytes) m.costs[static_cast<size_t>(stage)].activation_bytes = bytes;
    for (auto [stage, bytes] : st.weight_grad_bytes) m.costs[static_cast<size_t>(stage)].weight_grad_bytes = bytes;
  }
  auto mean = [&](int s, pipeline::ActionKind k) {
    auto it = sums[static_cast<size_t>(s)].find(k);
    return it == sums[static_cast<size_t>(s)].end() ? 0.0 : it->second.first / it->second.second;
  };
  for (int s = 0; s < S; ++s) {
    auto& c = m.costs[static_cast<size_t>(s)];
    c.forward = mean(s, pipeline::ActionKind::Forward);
    c.backward = mean(s, pipeline::ActionKind::Backward);
    c.backward_input = mean(s, pipeline::ActionKind::BackwardInput);
    c.backward_weight = mean(s, pipeline::ActionKind::BackwardWeight);
  }
  // The transfer time: the median send (a mean would count sends whose thread was descheduled).
  std::sort(sends.begin(), sends.end());
  m.send = sends.empty() ? 0 : sends[sends.size() / 2];
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 4;
  train::TrainConfig c;
  c.model.layers = argc > 2 ? std::atoi(argv[2]) : 8;
  c.model.hidden = argc > 3 ? std::atoi(argv[3]) : 128;
  c.model.seq = argc > 4 ? std::atoi(argv[4]) : 64;
  c.model.heads = 4, c.model.vocab = 128;
  c.parallel.mesh = "pp=2";
  c.optimizer.global_batch = 32, c.optimizer.accumulation = 8, c.optimizer.micro_batch = 0;  // 8 micro-batches of 4 sequences
  c.optimizer.lr = 1e-3, c.optimizer.warmup = 1;
  set_blas_threads(1);
  std::printf("GPT %lld layers, hidden %lld, seq %lld, vocab 128; pp=2 (threads), 8 micro-batches of 4 sequences; "
              "median of %d steps after one warm-up step\n\n",
              static_cast<long long>(c.model.layers), static_cast<long long>(c.model.hidden),
              static_cast<long long>(c.model.seq), steps);
  std::printf("| schedule | step ms: measured / replayed / mean times | bubble rank 0, 1: measured | replayed | "
              "mean times | peak activations rank 0, 1 (MiB): release | simulated | without release |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|\n");
  std::vector<std::string> notes;
  for (const char* schedule : {"fthenb", "1f1b", "interleaved", "zbh1"}) {
    Measured m = run(schedule, true, steps, c);
    Measured keep = run(schedule, false, steps, c);
    pipeline::SimOptions o;  // the stages' mean measured times
    o.stages = m.costs;
    o.send_time = m.send;
    pipeline::SimResult sim = pipeline::simulate(m.schedule, o);
    pipeline::SimOptions r = o;  // the median step's own action times
    r.durations = m.durations;
    pipeline::SimResult rep = pipeline::simulate(m.schedule, r);
    auto mib = [](int64_t b) { return static_cast<double>(b) / (1 << 20); };
    auto bubble = [](const pipeline::SimResult& x, int rank) {
      return (x.step_time - x.ranks[static_cast<size_t>(rank)].compute) / x.step_time;
    };
    std::printf("| %s | %.1f / %.1f / %.1f | %.3f, %.3f | %.3f, %.3f | %.3f, %.3f | %.2f, %.2f | %.2f, %.2f | %.2f, %.2f |\n",
                schedule, 1e3 * m.step, 1e3 * rep.step_time, 1e3 * sim.step_time, m.idle[0] / m.step, m.idle[1] / m.step,
                bubble(rep, 0), bubble(rep, 1), bubble(sim, 0), bubble(sim, 1), mib(m.peak[0]), mib(m.peak[1]),
                mib(sim.ranks[0].peak_bytes), mib(sim.ranks[1].peak_bytes), mib(keep.peak[0]), mib(keep.peak[1]));
    std::fflush(stdout);
    std::string times;
    for (size_t st = 0; st < m.costs.size(); ++st) {
      const auto& c = m.costs[st];
      times += m.schedule.split_backward
                   ? fmt::format(" stage {}: F {:.1f}, B-input {:.1f}, W {:.1f};", st, 1e3 * c.forward,
                                 1e3 * c.backward_input, 1e3 * c.backward_weight)
                   : fmt::format(" stage {}: F {:.1f}, B {:.1f};", st, 1e3 * c.forward, 1e3 * c.backward);
    }
    notes.push_back(fmt::format("{} mean ms:{} send {:.3f}", schedule, times, 1e3 * m.send));
  }
  std::printf("\n");
  for (const std::string& n : notes) std::printf("- %s\n", n.c_str());
  return 0;
}
