#include "shardwise/pipeline/validate.h"

#include <map>
#include <tuple>

#include "shardwise/core/error.h"
#include "shardwise/core/plural.h"

namespace shardwise::pipeline {
namespace {

using Key = std::tuple<ActionKind, int, int>;  // kind, stage, micro-batch

// The receive that matches a send (kind, stage on the receiving rank).
Action matching_recv(const Action& send, int sender) {
  if (send.kind == ActionKind::SendActivation) return {ActionKind::RecvActivation, send.stage + 1, send.micro_batch, sender};
  return {ActionKind::RecvGrad, send.stage - 1, send.micro_batch, sender};
}

class Validator {
 public:
  explicit Validator(const Schedule& s) : s_(s) {}

  void run() {
    SW_CHECK(s_.ranks >= 1 && s_.virtual_stages >= 1 && s_.micro_batches >= 1,
             "schedule '{}': {}, {}, {} (each must be at least 1)", s_.name, counted(s_.ranks, "rank"),
             counted(s_.virtual_stages, "virtual stage"), counted(s_.micro_batches, "micro-batch"));
    SW_CHECK(static_cast<int>(s_.actions.size()) == s_.ranks, "schedule '{}' has action lists for {} ranks, not {}",
             s_.name, s_.actions.size(), s_.ranks);
    for (int r = 0; r < s_.ranks; ++r) check_rank(r);
    check_counts();
    check_matching();
    check_no_deadlock();
  }

 private:
  [[noreturn]] void bad(int rank, size_t index, const std::string& why) const {
    const auto& list = s_.actions[static_cast<size_t>(rank)];
    fail("schedule '{}', rank {}, action {} ({}): {}", s_.name, rank, index,
         index < list.size() ? list[index].to_string(true) : "end", why);
  }

  void check_rank(int r) {
    const auto& list = s_.actions[static_cast<size_t>(r)];
    const int S = s_.stages();
    std::map<Key, size_t> seen;  // first position of each (kind, stage, mb) on this rank
    auto before = [&](ActionKind k, int stage, int mb) { return seen.contains({k, stage, mb}); };
    auto input_grad_done = [&](int stage, int mb) {
      return before(ActionKind::Backward, stage, mb) || before(ActionKind::BackwardInput, stage, mb);
    };
    for (size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      if (a.kind == ActionKind::OptimizerStep) {
        if (i + 1 != list.size()) bad(r, i, "the optimizer step must be the last action");
        continue;
      }
      if (a.stage < 0 || a.stage >= S || s_.rank_of(a.stage) != r)
        bad(r, i, fmt::format("stage {} does not run on rank {} ({} stages over {} ranks: stage s runs on rank s % {})",
                              a.stage, r, S, s_.ranks, s_.ranks));
      if (a.micro_batch < 0 || a.micro_batch >= s_.micro_batches)
        bad(r, i, fmt::format("micro-batch {} is out of range [0, {})", a.micro_batch, s_.micro_batches));
      const int mb = a.micro_batch, st = a.stage;
      const bool split = a.kind == ActionKind::BackwardInput || a.kind == ActionKind::BackwardWeight;
      if (is_compute(a.kind) && a.kind != ActionKind::Forward && split != s_.split_backward)
        bad(r, i, s_.split_backward ? "this schedule splits the backward: use backward-input and backward-weight"
                                    : "this schedule does not split the backward: use one backward action");
      switch (a.kind) {
        case ActionKind::Forward:
          if (st > 0 && !(s_.rank_of(st - 1) == r ? before(ActionKind::Forward, st - 1, mb)
                                                   : before(ActionKind::RecvActivation, st, mb)))
            bad(r, i, fmt::format("its input, the activation of stage {} for micro-batch {}, is neither computed nor "
                                  "received before",
                                  st - 1, mb));
          break;
        case ActionKind::Backward:
        case ActionKind::BackwardInput:
          if (!before(ActionKind::Forward, st, mb)) bad(r, i, "backward before the forward of the same micro-batch");
          if (st + 1 < S && !(s_.rank_of(st + 1) == r ? input_grad_done(st + 1, mb) : before(ActionKind::RecvGrad, st, mb)))
            bad(r, i, fmt::format("its output gradient (from stage {}) is neither computed nor received before", st + 1));
          break;
        case ActionKind::BackwardWeight:
          if (!before(ActionKind::BackwardInput, st, mb))
            bad(r, i, "weight gradient before the input gradient of the same micro-batch");
          break;
        case ActionKind::SendActivation:
          if (st + 1 >= S) bad(r, i, "the last stage has no next stage to send an activation to");
          if (a.peer != s_.rank_of(st + 1)) bad(r, i, fmt::format("stage {} is on rank {}, not {}", st + 1, s_.rank_of(st + 1), a.peer));
          if (a.peer == r) bad(r, i, "a send to the same rank (stages on one rank hand over without messages)");
          if (!before(ActionKind::Forward, st, mb)) bad(r, i, "sends an activation before the forward computes it");
          break;
        case ActionKind::SendGrad:
          if (st == 0) bad(r, i, "the first stage has no previous stage to send a gradient to");
          if (a.peer != s_.rank_of(st - 1)) bad(r, i, fmt::format("stage {} is on rank {}, not {}", st - 1, s_.rank_of(st - 1), a.peer));
          if (a.peer == r) bad(r, i, "a send to the same rank (stages on one rank hand over without messages)");
          if (!input_grad_done(st, mb)) bad(r, i, "sends a gradient before the backward computes it");
          break;
        case ActionKind::RecvActivation:
          if (st == 0 || a.peer != s_.rank_of(st - 1) || a.peer == r)
            bad(r, i, fmt::format("stage {}'s input comes from stage {} on rank {}", st, st - 1, st > 0 ? s_.rank_of(st - 1) : -1));
          break;
        case ActionKind::RecvGrad:
          if (st + 1 >= S || a.peer != s_.rank_of(st + 1) || a.peer == r)
            bad(r, i, fmt::format("stage {}'s output gradient comes from stage {} on rank {}", st, st + 1,
                                  st + 1 < S ? s_.rank_of(st + 1) : -1));
          break;
        case ActionKind::OptimizerStep: break;
      }
      if (!seen.try_emplace({a.kind, st, mb}, i).second)
        bad(r, i, fmt::format("micro-batch {} already had this action on stage {} (at {})", mb, st, seen[{a.kind, st, mb}]));
    }
    if (list.empty() || list.back().kind != ActionKind::OptimizerStep)
      bad(r, list.size(), "the list must end with the optimizer step");
    for (const auto& [key, pos] : seen) counts_[key] += 1;
  }

  void check_counts() {
    const int S = s_.stages();
    for (int st = 0; st < S; ++st) {
      for (int mb = 0; mb < s_.micro_batches; ++mb) {
        auto need = [&](ActionKind k) {
          const int n = counts_[Key(k, st, mb)];
          SW_CHECK(n == 1, "schedule '{}': micro-batch {} has no {} on stage {} (rank {})", s_.name, mb,
                   action_kind_name(k), st, s_.rank_of(st));
        };
        need(ActionKind::Forward);
        if (s_.forward_only) continue;
        if (s_.split_backward) {
          need(ActionKind::BackwardInput);
          need(ActionKind::BackwardWeight);
        } else {
          need(ActionKind::Backward);
        }
      }
    }
  }

  void check_matching() {
    for (int r = 0; r < s_.ranks; ++r) {
      for (const Action& a : s_.actions[static_cast<size_t>(r)]) {
        if (!is_send(a.kind)) continue;
        Action want = matching_recv(a, r);
        if (!counts_.contains({want.kind, want.stage, want.micro_batch}))
          fail("schedule '{}': rank {} sends {} but rank {} never receives it ({} missing)", s_.name, r, a.to_string(true),
               a.peer, want.to_string(true));
      }
      for (const Action& a : s_.actions[static_cast<size_t>(r)]) {
        if (!is_recv(a.kind)) continue;
        ActionKind send = a.kind == ActionKind::RecvActivation ? ActionKind::SendActivation : ActionKind::SendGrad;
        int stage = a.kind == ActionKind::RecvActivation ? a.stage - 1 : a.stage + 1;
        if (!counts_.contains({send, stage, a.micro_batch}))
          fail("schedule '{}': rank {} waits for {} but rank {} never sends it", s_.name, r, a.to_string(true), a.peer);
      }
    }
  }

  // Blocking point-to-point: a send and its receive complete together, when both ranks reach them.
  void check_no_deadlock() {
    const auto p = static_cast<size_t>(s_.ranks);
    std::vector<size_t> pc(p, 0);
    for (bool progress = true; progress;) {
      progress = false;
      for (size_t r = 0; r < p; ++r) {
        const auto& list = s_.actions[r];
        while (pc[r] < list.size()) {
          const Action& a = list[pc[r]];
          if (is_recv(a.kind)) break;  // completed by its sender
          if (is_send(a.kind)) {
            auto q = static_cast<size_t>(a.peer);
            const auto& peer_list = s_.actions[q];
            if (pc[q] >= peer_list.size() || !(peer_list[pc[q]] == matching_recv(a, static_cast<int>(r)))) break;
            ++pc[q];
          }
          ++pc[r];
          progress = true;
        }
      }
    }
    std::vector<std::string> blocked;
    for (size_t r = 0; r < p; ++r) {
      if (pc[r] < s_.actions[r].size()) blocked.push_back(fmt::format("rank {} at {}", r, s_.actions[r][pc[r]].to_string(true)));
    }
    SW_CHECK(blocked.empty(),
             "schedule '{}' deadlocks under blocking point-to-point: {} (each waits for a peer that waits elsewhere)",
             s_.name, fmt::join(blocked, ", "));
  }

  const Schedule& s_;
  std::map<Key, int> counts_;
};

}  // namespace

void validate(const Schedule& schedule) { Validator(schedule).run(); }

}  // namespace shardwise::pipeline
