#include "shardwise/pipeline/simulate.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "shardwise/core/error.h"
#include "shardwise/core/plural.h"

namespace shardwise::pipeline {

double SimResult::max_bubble_fraction() const {
  double m = 0;
  for (const RankSim& r : ranks) m = std::max(m, r.bubble_fraction);
  return m;
}

int64_t SimResult::max_peak_bytes() const {
  int64_t m = 0;
  for (const RankSim& r : ranks) m = std::max(m, r.peak_bytes);
  return m;
}

std::string SimResult::summary() const {
  std::string out = fmt::format("step time {:.6g}\n", step_time);
  for (size_t r = 0; r < ranks.size(); ++r) {
    const RankSim& s = ranks[r];
    out += fmt::format("rank {}: busy {:.6g}, idle {:.6g}, bubble {:.4f}, peak activations {} ({})\n", r, s.compute,
                       step_time - s.compute, s.bubble_fraction, s.peak_bytes, counted(s.peak_micro_batches, "micro-batch"));
  }
  return out;
}

SimResult simulate(const Schedule& s, const SimOptions& o) {
  const int S = s.stages();
  SW_CHECK(o.stages.size() == 1 || static_cast<int>(o.stages.size()) == S,
           "simulate: give costs for every one of the {} stages or one entry for all, got {}", S, o.stages.size());
  auto costs = [&](int stage) -> const StageCosts& { return o.stages.size() == 1 ? o.stages[0] : o.stages[static_cast<size_t>(stage)]; };
  const auto p = static_cast<size_t>(s.ranks);
  SimResult res;
  res.ranks.resize(p);
  std::vector<size_t> pc(p, 0);
  std::vector<double> clock(p, 0);
  std::vector<int64_t> held(p, 0);
  std::vector<int> in_flight(p, 0);
  SW_CHECK(o.durations.empty() || o.durations.size() == p, "simulate: durations for {} ranks, the schedule has {}",
           o.durations.size(), p);
  for (size_t r = 0; r < o.durations.size(); ++r)
    SW_CHECK(o.durations[r].size() == s.actions[r].size(), "simulate: {} durations for rank {}'s {} actions",
             o.durations[r].size(), r, s.actions[r].size());
  auto replay = [&](size_t r, size_t i, double planned) { return o.durations.empty() ? planned : o.durations[r][i]; };
  std::map<std::tuple<ActionKind, int, int>, double> arrival;  // keyed by the receive
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t r = 0; r < p; ++r) {
      const auto& list = s.actions[r];
      RankSim& rs = res.ranks[r];
      while (pc[r] < list.size()) {
        const Action& a = list[pc[r]];
        double start = clock[r], end = start;
        if (is_recv(a.kind)) {
          auto it = arrival.find({a.kind, a.stage, a.micro_batch});
          if (it == arrival.end()) break;  // its message is not sent yet
          end = std::max(start, it->second) + replay(r, pc[r], 0);
        } else if (is_send(a.kind)) {
          const double busy = replay(r, pc[r], o.send_time);
          end = start + busy;
          const double arrives = start + std::min(busy, o.send_time);
          if (a.kind == ActionKind::SendActivation) arrival[{ActionKind::RecvActivation, a.stage + 1, a.micro_batch}] = arrives;
          else arrival[{ActionKind::RecvGrad, a.stage - 1, a.micro_batch}] = arrives;
        } else if (is_compute(a.kind)) {
          const StageCosts& c = costs(a.stage);
          double d = replay(r, pc[r],
                            a.kind == ActionKind::Forward          ? c.forward
                            : a.kind == ActionKind::Backward       ? c.backward
                            : a.kind == ActionKind::BackwardInput  ? c.backward_input
                                                                   : c.backward_weight);
          end = start + d;
          rs.compute += d;
          switch (a.kind) {
            case ActionKind::Forward: held[r] += c.activation_bytes, ++in_flight[r]; break;
            case ActionKind::Backward: held[r] -= c.activation_bytes, --in_flight[r]; break;
            case ActionKind::BackwardInput: held[r] -= c.activation_bytes - c.weight_grad_bytes; break;
            default: held[r] -= c.weight_grad_bytes, --in_flight[r]; break;
          }
          if (held[r] > rs.peak_bytes) rs.peak_bytes = held[r];
          rs.peak_micro_batches = std::max(rs.peak_micro_batches, in_flight[r]);
        }
        rs.timeline.push_back({a, start, end});
        clock[r] = end;
        ++pc[r];
        progress = true;
      }
    }
  }
  for (size_t r = 0; r < p; ++r) {
    SW_CHECK(pc[r] == s.actions[r].size(), "simulate: schedule '{}' cannot run: rank {} waits forever at {} (validate it)",
             s.name, r, s.actions[r][pc[r]].to_string(true));
    res.step_time = std::max(res.step_time, clock[r]);
  }
  for (RankSim& rs : res.ranks) rs.bubble_fraction = res.step_time > 0 ? (res.step_time - rs.compute) / res.step_time : 0;
  return res;
}

namespace {

std::string color(ActionKind k) {
  switch (k) {
    case ActionKind::Forward: return "#4e79a7";
    case ActionKind::Backward: return "#59a14f";
    case ActionKind::BackwardInput: return "#76b7b2";
    case ActionKind::BackwardWeight: return "#f28e2b";
    default: return "#bab0ac";
  }
}

}  // namespace

std::string timeline_svg(const Schedule& s, const SimResult& r, const std::string& title) {
  const double left = 70, top = 40, row = 30, width = 1000;
  const double scale = r.step_time > 0 ? width / r.step_time : 1;
  const double height = top + row * static_cast<double>(s.ranks) + 40;
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"11\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      left + width + 20, height);
  std::string heading = title.empty() ? fmt::format("{}: {}, {}{}", s.name, counted(s.ranks, "rank"), counted(s.micro_batches, "micro-batch"),
                                                    s.virtual_stages > 1 ? fmt::format(", {} virtual stages", s.virtual_stages) : "")
                                      : title;
  out += fmt::format("<text x=\"{}\" y=\"20\" font-size=\"14\">{} (step {:.4g}, bubble {:.1f}%)</text>\n", left, heading,
                     r.step_time, 100 * r.max_bubble_fraction());
  for (size_t rank = 0; rank < r.ranks.size(); ++rank) {
    double y = top + row * static_cast<double>(rank);
    out += fmt::format("<text x=\"5\" y=\"{}\">rank {}</text>\n", y + row / 2 + 4, rank);
    out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#f4f4f4\"/>\n", left, y + 2, width, row - 4);
    for (const TimedAction& t : r.ranks[rank].timeline) {
      if (!is_compute(t.action.kind) || t.end <= t.start) continue;
      double x = left + t.start * scale, w = (t.end - t.start) * scale;
      // Later virtual stages of a rank are drawn lighter.
      double opacity = 1.0 - 0.35 * static_cast<double>(t.action.stage / s.ranks) / std::max(1, s.virtual_stages - 1);
      out += fmt::format(
          "<rect x=\"{:.2f}\" y=\"{}\" width=\"{:.2f}\" height=\"{}\" fill=\"{}\" fill-opacity=\"{:.2f}\" stroke=\"white\" "
          "stroke-width=\"0.5\"><title>{}</title></rect>\n",
          x, y + 2, w, row - 4, color(t.action.kind), opacity, t.action.to_string(true));
      if (w > 12)
        out += fmt::format("<text x=\"{:.2f}\" y=\"{}\" fill=\"white\" text-anchor=\"middle\">{}</text>\n", x + w / 2,
                           y + row / 2 + 4, t.action.micro_batch);
    }
  }
  double ly = top + row * static_cast<double>(s.ranks) + 20;
  double lx = left;
  for (auto [kind, label] : {std::pair{ActionKind::Forward, "forward"}, {ActionKind::Backward, "backward"},
                             {ActionKind::BackwardInput, "input gradient"}, {ActionKind::BackwardWeight, "weight gradient"}}) {
    out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{}</text>\n",
                       lx, ly - 10, color(kind), lx + 16, ly, label);
    lx += 130;
  }
  return out + "</svg>\n";
}

}  // namespace shardwise::pipeline
