#include "shardwise/train/memory_advice.h"

#include <algorithm>
#include <functional>

#include "shardwise/core/error.h"
#include "shardwise/core/plural.h"

namespace shardwise::train {

namespace {

bool recomputes_all(const TrainConfig& c) { return c.model.recompute == "full" && c.model.recompute_layers < 0; }

// The parts of a rank's peak, largest first.
std::vector<std::pair<int64_t, std::string>> parts_of(const RankMemory& r) {
  std::vector<std::pair<int64_t, std::string>> parts = {
      {r.params, "parameters"}, {r.grads, "gradients"}, {r.optimizer, "optimizer moments"}, {r.masters, "fp32 masters"},
      {r.working, "activations and working buffers"}, {r.comm, "pipeline buffers"}};
  std::stable_sort(parts.begin(), parts.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return parts;
}

// Plans `alt` (the run with one change) when the run's checks accept it; false when they refuse it.
bool try_change(const std::string& what, TrainConfig alt, const MemoryPlan& plan, int64_t limit,
                std::vector<MemoryChange>& out) {
  try {
    alt.check(static_cast<int64_t>(plan.ranks.size()), false);
  } catch (const Error&) {
    return false;
  }
  const int64_t need = plan_memory(alt, plan.threads, plan.symmetric).per_process();
  out.push_back({what, need, need <= limit});
  return true;
}

// The smallest micro-batch that fits (halving, the global batch kept), else the smallest there is.
void try_micro_batch(const TrainConfig& c, const MemoryPlan& plan, int64_t limit, std::vector<MemoryChange>& out) {
  std::vector<MemoryChange> tried;
  for (int64_t m = c.optimizer.micro_batch / 2; m >= 1; m /= 2) {
    TrainConfig alt = c;
    alt.optimizer.micro_batch = m, alt.optimizer.accumulation = 0;
    if (c.optimizer.global_batch % m != 0) continue;
    const int64_t acc = c.optimizer.accumulation * c.optimizer.micro_batch / m;
    if (!try_change(fmt::format("--micro-batch {} (accumulation {}, the same global batch)", m, acc), alt, plan, limit,
                    tried))
      continue;
    if (tried.back().fits) break;
  }
  if (!tried.empty()) out.push_back(tried.back());
}

}  // namespace

const MemoryChange* MemoryAdvice::fix() const {
  for (const MemoryChange& m : changes) {
    if (m.fits) return &m;
  }
  return nullptr;
}

std::string MemoryAdvice::changes_text() const {
  std::vector<std::string> all;
  for (const MemoryChange& m : changes)
    all.push_back(fmt::format("{} ({}{})", m.change, human_bytes(m.bytes), m.fits ? ", fits" : ""));
  all.push_back(more_ranks);
  return fmt::format("{}", fmt::join(all, ", "));
}

nlohmann::json MemoryAdvice::to_json() const {
  nlohmann::json j = {{"cause", cause}, {"cause_bytes", cause_bytes}, {"cause_detail", cause_detail},
                      {"fix", fix() ? nlohmann::json(fix()->change) : nlohmann::json(nullptr)}};
  j["changes"] = nlohmann::json::array();
  for (const MemoryChange& m : changes) j["changes"].push_back({{"change", m.change}, {"bytes", m.bytes}, {"fits", m.fits}});
  return j;
}

MemoryAdvice advise_memory(const TrainConfig& c, const MemoryPlan& plan, int64_t limit) {
  MemoryAdvice a;
  const auto parts = parts_of(plan.largest());
  a.cause = parts[0].second, a.cause_bytes = parts[0].first;
  const bool activations = a.cause == "activations and working buffers";
  if (activations) a.cause_detail = fmt::format("micro-batch {} x {} tokens", c.optimizer.micro_batch, c.model.seq);
  const Strategy s = Strategy::from_mesh(mesh::parse_mesh(c.parallel.mesh), c.parallel.sequence_parallel);
  auto with = [&](const std::function<void(TrainConfig&)>& change) {
    TrainConfig alt = c;
    change(alt);
    return alt;
  };
  auto full_recompute = [](TrainConfig& t) { t.model.recompute = "full", t.model.recompute_layers = -1; };
  // The likeliest fix first: the batch's activations, or the state the sharding stages split.
  std::vector<std::function<void()>> order;
  auto micro = [&] { if (c.optimizer.micro_batch > 1) try_micro_batch(c, plan, limit, a.changes); };
  auto recompute = [&] { if (!recomputes_all(c)) try_change("--recompute full", with(full_recompute), plan, limit, a.changes); };
  auto state = [&] {
    if (s.dp_size() > 1 && c.parallel.sharding.stage < 2)
      try_change("--sharding-stage 2", with([](TrainConfig& t) { t.parallel.sharding.stage = 2; }), plan, limit, a.changes);
    if (s.dp_size() > 1 && c.parallel.sharding.stage < 3) {
      try_change("--sharding-stage 3", with([](TrainConfig& t) { t.parallel.sharding.stage = 3; }), plan, limit, a.changes);
      if (!recomputes_all(c))
        try_change("--sharding-stage 3 --recompute full", with([&](TrainConfig& t) { t.parallel.sharding.stage = 3, full_recompute(t); }),
                   plan, limit, a.changes);
    }
  };
  auto bf16 = [&] { if (!c.bf16) try_change("--bf16", with([](TrainConfig& t) { t.bf16 = true; }), plan, limit, a.changes); };
  if (activations) order = {micro, recompute, state, bf16};
  else order = {state, bf16, micro, recompute};
  for (auto& step : order) step();
  if (!a.fix()) {  // every change together
    TrainConfig all = with(full_recompute);
    std::string what = "--recompute full";
    if (c.optimizer.micro_batch > 1 && c.optimizer.global_batch % c.optimizer.micro_batch == 0)
      all.optimizer.micro_batch = 1, all.optimizer.accumulation = 0, what = "--micro-batch 1 " + what;
    if (s.dp_size() > 1) all.parallel.sharding.stage = 3, what += " --sharding-stage 3";
    all.bf16 = true;
    if (!try_change(what + " --bf16", all, plan, limit, a.changes)) {
      all.bf16 = c.bf16;
      try_change(what, all, plan, limit, a.changes);
    }
  }
  a.more_ranks = plan.threads ? "more tp / pp ranks as MPI processes (mpirun: one rank a process)"
                              : "more tp / pp (or dp with sharding) processes";
  return a;
}

std::string does_not_fit(const MemoryPlan& plan, const MemoryAdvice& a, int64_t limit, const std::string& limit_text) {
  const RankMemory& r = plan.largest();
  std::string out = fmt::format(
      "does not fit: {} per process ({}) over --memory-limit {} ({}); the largest part: {} {} of rank {}'s {}{}\n",
      human_bytes(plan.per_process()), plan.threads ? counted(static_cast<int64_t>(plan.ranks.size()), "rank") + " as threads" : "one MPI rank",
      limit_text, human_bytes(limit), a.cause, human_bytes(a.cause_bytes), r.rank, human_bytes(r.peak()),
      a.cause_detail.empty() ? "" : " (" + a.cause_detail + ")");
  if (const MemoryChange* fix = a.fix())
    out += fmt::format("  fix: {}: {} per process, fits\n", fix->change, human_bytes(fix->bytes));
  else
    out += "  no single change here fits: " + a.more_ranks + "\n";
  std::vector<std::string> others;
  for (const MemoryChange& m : a.changes) {
    if (&m != a.fix()) others.push_back(fmt::format("{} ({}{})", m.change, human_bytes(m.bytes), m.fits ? ", fits" : ""));
  }
  if (!others.empty()) out += fmt::format("  other changes: {}\n", fmt::join(others, "; "));
  return out;
}

void check_memory_limit(const TrainConfig& c, const MemoryPlan& plan, int64_t limit, const std::string& limit_text) {
  if (limit <= 0 || plan.per_process() <= limit) return;
  const RankMemory& r = plan.largest();
  const auto parts = parts_of(r);
  const MemoryAdvice a = advise_memory(c, plan, limit);
  fail("the run's estimated peak memory is {} per process ({}), over --memory-limit {} ({}); rank {}: {} = {} {}, {} "
       "{}, {} {}, ...; to fit try {} (`shardwise plan --memory` prints the plan)",
       human_bytes(plan.per_process()), plan.threads ? counted(static_cast<int64_t>(plan.ranks.size()), "rank") + " as threads" : "one MPI rank",
       limit_text, human_bytes(limit), r.rank, human_bytes(r.peak()), parts[0].second, human_bytes(parts[0].first),
       parts[1].second, human_bytes(parts[1].first), parts[2].second, human_bytes(parts[2].first), a.changes_text());
}

}  // namespace shardwise::train
