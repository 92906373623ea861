#include "shardwise/pipeline/schedule.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "shardwise/core/error.h"
#include "shardwise/core/plural.h"

namespace shardwise::pipeline {

std::string_view action_kind_name(ActionKind kind) {
  switch (kind) {
    case ActionKind::Forward: return "forward";
    case ActionKind::Backward: return "backward";
    case ActionKind::BackwardInput: return "backward-input";
    case ActionKind::BackwardWeight: return "backward-weight";
    case ActionKind::SendActivation: return "send-activation";
    case ActionKind::RecvActivation: return "recv-activation";
    case ActionKind::SendGrad: return "send-grad";
    case ActionKind::RecvGrad: return "recv-grad";
    case ActionKind::OptimizerStep: return "optimizer-step";
  }
  return "?";
}

bool is_compute(ActionKind k) {
  return k == ActionKind::Forward || k == ActionKind::Backward || k == ActionKind::BackwardInput ||
         k == ActionKind::BackwardWeight;
}
bool is_send(ActionKind k) { return k == ActionKind::SendActivation || k == ActionKind::SendGrad; }
bool is_recv(ActionKind k) { return k == ActionKind::RecvActivation || k == ActionKind::RecvGrad; }

std::string Action::to_string(bool show_stage) const {
  std::string where = show_stage ? fmt::format(".s{}", stage) : "";
  switch (kind) {
    case ActionKind::Forward: return fmt::format("F{}{}", micro_batch, where);
    case ActionKind::Backward: return fmt::format("B{}{}", micro_batch, where);
    case ActionKind::BackwardInput: return fmt::format("Bi{}{}", micro_batch, where);
    case ActionKind::BackwardWeight: return fmt::format("W{}{}", micro_batch, where);
    case ActionKind::SendActivation: return fmt::format("sendA{}{}>{}", micro_batch, where, peer);
    case ActionKind::RecvActivation: return fmt::format("recvA{}{}<{}", micro_batch, where, peer);
    case ActionKind::SendGrad: return fmt::format("sendG{}{}>{}", micro_batch, where, peer);
    case ActionKind::RecvGrad: return fmt::format("recvG{}{}<{}", micro_batch, where, peer);
    case ActionKind::OptimizerStep: return "step";
  }
  return "?";
}

std::string_view schedule_kind_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::FThenB: return "fthenb";
    case ScheduleKind::OneFOneB: return "1f1b";
    case ScheduleKind::Interleaved: return "interleaved";
    case ScheduleKind::ZeroBubbleH1: return "zbh1";
  }
  return "?";
}

ScheduleKind parse_schedule_kind(std::string_view name) {
  if (name == "fthenb" || name == "gpipe") return ScheduleKind::FThenB;
  if (name == "1f1b") return ScheduleKind::OneFOneB;
  if (name == "interleaved" || name == "interleaved-1f1b") return ScheduleKind::Interleaved;
  if (name == "zbh1" || name == "zb-h1") return ScheduleKind::ZeroBubbleH1;
  fail("unknown pipeline schedule '{}': use fthenb (gpipe), 1f1b, interleaved or zbh1", name);
}

std::vector<int> Schedule::stages_of(int rank) const {
  std::vector<int> out;
  for (int s = rank; s < stages(); s += ranks) out.push_back(s);
  return out;
}

std::string Schedule::to_string() const {
  std::string out;
  const bool show_stage = virtual_stages > 1;
  for (size_t r = 0; r < actions.size(); ++r) {
    std::vector<std::string> parts;
    for (const Action& a : actions[r]) parts.push_back(a.to_string(show_stage));
    out += fmt::format("rank {}: {}\n", r, fmt::join(parts, " "));
  }
  return out;
}

namespace {

void check_basic(std::string_view name, int ranks, int micro_batches) {
  SW_CHECK(ranks >= 1, "{}: a pipeline needs at least 1 rank, got {}", name, ranks);
  SW_CHECK(micro_batches >= 1, "{}: a pipeline needs at least 1 micro-batch, got {}", name, micro_batches);
}

Schedule empty(std::string name, int ranks, int virtual_stages, int micro_batches, bool split) {
  Schedule s;
  s.name = std::move(name);
  s.ranks = ranks, s.virtual_stages = virtual_stages, s.micro_batches = micro_batches, s.split_backward = split;
  s.actions.resize(static_cast<size_t>(ranks));
  return s;
}

Action compute(ActionKind kind, int stage, int mb) { return Action{kind, stage, mb, -1}; }

}  // namespace

Schedule fthenb(int p, int m) {
  check_basic("fthenb", p, m);
  Schedule s = empty("fthenb", p, 1, m, false);
  for (int r = 0; r < p; ++r) {
    for (int i = 0; i < m; ++i) s.actions[static_cast<size_t>(r)].push_back(compute(ActionKind::Forward, r, i));
    for (int i = 0; i < m; ++i) s.actions[static_cast<size_t>(r)].push_back(compute(ActionKind::Backward, r, i));
  }
  add_communication(s);
  return s;
}

Schedule one_f_one_b(int p, int m) {
  check_basic("1f1b", p, m);
  Schedule s = empty("1f1b", p, 1, m, false);
  for (int r = 0; r < p; ++r) {
    auto& list = s.actions[static_cast<size_t>(r)];
    const int warmup = std::min(p - 1 - r, m);  // forwards before the first backward, besides the steady one
    for (int i = 0; i < warmup; ++i) list.push_back(compute(ActionKind::Forward, r, i));
    for (int i = 0; i < m - warmup; ++i) {
      list.push_back(compute(ActionKind::Forward, r, warmup + i));
      list.push_back(compute(ActionKind::Backward, r, i));
    }
    for (int i = m - warmup; i < m; ++i) list.push_back(compute(ActionKind::Backward, r, i));
  }
  add_communication(s);
  return s;
}

Schedule interleaved_1f1b(int p, int v, int m) {
  check_basic("interleaved", p, m);
  SW_CHECK(v >= 2, "interleaved: needs at least 2 virtual stages per rank (--virtual), got {}; with 1 use 1f1b", v);
  SW_CHECK(m % p == 0,
           "interleaved: {} are not a multiple of the {} (the schedule runs rounds of {} through each "
           "virtual stage)",
           counted(m, "micro-batch"), counted(p, "pipeline rank"), counted(p, "micro-batch"));
  Schedule s = empty("interleaved", p, v, m, false);
  const int total = m * v;  // virtual micro-steps per rank
  // Virtual micro-step k: chunk (k / p) % v (backward: reversed), micro-batch (k / (p v)) * p + k % p.
  auto chunk = [&](int k, bool forward) {
    int c = (k % (p * v)) / p;
    return forward ? c : v - 1 - c;
  };
  auto mb = [&](int k) { return (k / (p * v)) * p + k % p; };
  for (int r = 0; r < p; ++r) {
    auto& list = s.actions[static_cast<size_t>(r)];
    const int warmup = std::min((p - r - 1) * 2 + (v - 1) * p, total);
    auto fwd = [&](int k) { list.push_back(compute(ActionKind::Forward, chunk(k, true) * p + r, mb(k))); };
    auto bwd = [&](int k) { list.push_back(compute(ActionKind::Backward, chunk(k, false) * p + r, mb(k))); };
    for (int k = 0; k < warmup; ++k) fwd(k);
    for (int k = 0; k < total - warmup; ++k) {
      fwd(k + warmup);
      bwd(k);
    }
    for (int k = total - warmup; k < total; ++k) bwd(k);
  }
  add_communication(s);
  return s;
}

Schedule zero_bubble_h1(int p, int m) {
  check_basic("zbh1", p, m);
  SW_CHECK(m >= p,
           "zbh1: {} for {}; the zero-bubble schedule needs at least as many micro-batches as ranks",
           counted(m, "micro-batch"), counted(p, "pipeline rank"));
  Schedule s = empty("zbh1", p, 1, m, true);
  // Rank r: the p - r warm-up forwards of 1F1B; then for each micro-batch j its input gradient, the
  // weight gradient of micro-batch j - r (the later ranks defer theirs into what was 1F1B's cool-down
  // bubble), and the next forward. At most p micro-batches are in flight (forward done, weight
  // gradient not), the first rank's 1F1B peak.
  for (int r = 0; r < p; ++r) {
    auto& list = s.actions[static_cast<size_t>(r)];
    for (int j = 0; j < p - r; ++j) list.push_back(compute(ActionKind::Forward, r, j));
    for (int j = 0; j < m; ++j) {
      list.push_back(compute(ActionKind::BackwardInput, r, j));
      if (j >= r) list.push_back(compute(ActionKind::BackwardWeight, r, j - r));
      if (j + p - r < m) list.push_back(compute(ActionKind::Forward, r, j + p - r));
    }
    for (int j = m - r; j < m; ++j) list.push_back(compute(ActionKind::BackwardWeight, r, j));
  }
  add_communication(s);
  return s;
}

Schedule forward_only(int p, int v, int m) {
  check_basic("forward-only", p, m);
  Schedule s = empty("forward-only", p, v, m, false);
  s.forward_only = true;
  for (int r = 0; r < p; ++r)
    for (int i = 0; i < m; ++i)
      for (int st : s.stages_of(r)) s.actions[static_cast<size_t>(r)].push_back(compute(ActionKind::Forward, st, i));
  add_communication(s);
  return s;
}

Schedule make_schedule(ScheduleKind kind, int ranks, int micro_batches, int virtual_stages) {
  SW_CHECK(virtual_stages >= 1, "virtual stages per rank must be at least 1, got {}", virtual_stages);
  SW_CHECK(kind == ScheduleKind::Interleaved || virtual_stages == 1,
           "{} runs one stage per rank: --virtual {} needs the interleaved schedule", schedule_kind_name(kind),
           virtual_stages);
  switch (kind) {
    case ScheduleKind::FThenB: return fthenb(ranks, micro_batches);
    case ScheduleKind::OneFOneB: return one_f_one_b(ranks, micro_batches);
    case ScheduleKind::Interleaved: return interleaved_1f1b(ranks, virtual_stages, micro_batches);
    case ScheduleKind::ZeroBubbleH1: return zero_bubble_h1(ranks, micro_batches);
  }
  fail("unknown schedule");
}

void add_communication(Schedule& s) {
  const int p = s.ranks, S = s.stages();
  // Unit-time execution of the compute lists with messages arriving when they are produced.
  using Key = std::tuple<int, int, int>;  // (kind: 0 F, 1 input gradient, 2 W), stage, micro-batch
  std::map<Key, int> end;                 // end time of each computed action
  struct Event {
    int time;
    int order;  // 0: message (before compute starts at the same time), 1: compute start
    int rank;
    size_t index;  // compute: index in the rank's list; message: index into `messages`
  };
  struct Message {
    Action send, recv;
    int from, to;
  };
  std::vector<Event> events;
  std::vector<Message> messages;
  std::vector<size_t> pc(static_cast<size_t>(p), 0);
  std::vector<int> clock(static_cast<size_t>(p), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      auto& list = s.actions[static_cast<size_t>(r)];
      for (size_t& i = pc[static_cast<size_t>(r)]; i < list.size(); ++i) {
        const Action& a = list[i];
        SW_CHECK(is_compute(a.kind), "add_communication: rank {} already has a {} action", r, action_kind_name(a.kind));
        std::vector<Key> deps;
        int kind = 0, duration = 1;
        if (a.kind == ActionKind::Forward) {
          if (a.stage > 0) deps.push_back({0, a.stage - 1, a.micro_batch});
        } else if (a.kind == ActionKind::BackwardWeight) {
          kind = 2;
          deps.push_back({1, a.stage, a.micro_batch});
        } else {
          kind = 1;
          duration = a.kind == ActionKind::Backward ? 2 : 1;
          deps.push_back({0, a.stage, a.micro_batch});
          if (a.stage + 1 < S) deps.push_back({1, a.stage + 1, a.micro_batch});
        }
        int start = clock[static_cast<size_t>(r)];
        bool ready = true;
        for (const Key& d : deps) {
          auto it = end.find(d);
          if (it == end.end()) ready = false;
          else start = std::max(start, it->second);
        }
        if (!ready) break;
        progress = true;
        const int finish = start + duration;
        end[{kind, a.stage, a.micro_batch}] = finish;
        clock[static_cast<size_t>(r)] = finish;
        events.push_back({start, 1, r, i});
        if (kind == 0 && a.stage + 1 < S && s.rank_of(a.stage + 1) != r) {
          int to = s.rank_of(a.stage + 1);
          messages.push_back({{ActionKind::SendActivation, a.stage, a.micro_batch, to},
                              {ActionKind::RecvActivation, a.stage + 1, a.micro_batch, r}, r, to});
          events.push_back({finish, 0, r, messages.size() - 1});
        }
        if (kind == 1 && a.stage > 0 && s.rank_of(a.stage - 1) != r) {
          int to = s.rank_of(a.stage - 1);
          messages.push_back({{ActionKind::SendGrad, a.stage, a.micro_batch, to},
                              {ActionKind::RecvGrad, a.stage - 1, a.micro_batch, r}, r, to});
          events.push_back({finish, 0, r, messages.size() - 1});
        }
      }
    }
  }
  for (int r = 0; r < p; ++r) {
    const auto& list = s.actions[static_cast<size_t>(r)];
    SW_CHECK(pc[static_cast<size_t>(r)] == list.size(),
             "internal: the {} compute lists cannot run: rank {} waits at {} for an input no rank produces", s.name, r,
             list[pc[static_cast<size_t>(r)]].to_string(true));
  }
  std::stable_sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return std::tie(a.time, a.order, a.rank) < std::tie(b.time, b.order, b.rank);
  });
  std::vector<std::vector<Action>> lists(static_cast<size_t>(p));
  for (const Event& e : events) {
    if (e.order == 1) {
      lists[static_cast<size_t>(e.rank)].push_back(s.actions[static_cast<size_t>(e.rank)][e.index]);
    } else {
      const Message& m = messages[e.index];
      lists[static_cast<size_t>(m.from)].push_back(m.send);
      lists[static_cast<size_t>(m.to)].push_back(m.recv);
    }
  }
  for (auto& list : lists) list.push_back(Action{ActionKind::OptimizerStep, -1, -1, -1});
  s.actions = std::move(lists);
}

std::vector<LayerRange> split_layers(int layers, int stages, int virtual_stages) {
  SW_CHECK(stages >= 1, "a pipeline needs at least 1 stage, got {}", stages);
  SW_CHECK(layers >= stages,
           "{} layers cannot fill {} pipeline stages: every stage needs at least one layer (use fewer stages or more "
           "layers)",
           layers, stages);
  SW_CHECK(virtual_stages >= 1 && stages % virtual_stages == 0,
           "{} stages do not make {} virtual stages on each pipeline rank", stages, virtual_stages);
  std::vector<int> count(static_cast<size_t>(stages), layers / stages);
  // Extra layers: middle stages first, then the first (embeddings are cheap), the last (head) last.
  // Interleaved, the stages are the p x v chunks in pipeline order: Llama 3's 126 layers in 16 x 4
  // chunks leave one layer to the first chunk (rank 0's) and the last (rank 15's), two to the others.
  std::vector<int> order;
  for (int s = 1; s + 1 < stages; ++s) order.push_back(s);
  order.push_back(0);
  if (stages > 1) order.push_back(stages - 1);
  for (int k = 0; k < layers % stages; ++k) ++count[static_cast<size_t>(order[static_cast<size_t>(k)])];
  std::vector<LayerRange> out;
  int at = 0;
  for (int c : count) {
    out.push_back({at, at + c});
    at += c;
  }
  return out;
}

}  // namespace shardwise::pipeline
