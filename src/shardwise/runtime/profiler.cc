#include "shardwise/runtime/profiler.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "shardwise/core/error.h"
#include "shardwise/tensor/allocator.h"
#include "shardwise/tensor/device_allocator.h"
#include "shardwise/core/plural.h"
#include "shardwise/core/table.h"

namespace shardwise::runtime {

namespace {

thread_local RankProfile* current = nullptr;

void thread_faults(int64_t& minflt, int64_t& majflt) {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  minflt = u.ru_minflt;
  majflt = u.ru_majflt;
}

constexpr EventKind kKinds[] = {EventKind::Step, EventKind::Eval, EventKind::Op, EventKind::Fill,
                                EventKind::Reshard, EventKind::Collective, EventKind::Optimizer};

// Steps, evaluations and reshards are one type each; the rest by name.
bool one_type(EventKind k) { return k == EventKind::Step || k == EventKind::Eval || k == EventKind::Reshard; }

nlohmann::json to_json(const RankProfile& p) {
  nlohmann::json events = nlohmann::json::array();
  std::vector<int64_t> minflt, majflt;
  for (const ProfileEvent& e : p.events()) {
    events.push_back({static_cast<int>(e.kind), e.name, e.detail, e.start_ns, e.dur_ns, e.bytes, e.minflt, e.majflt});
    if (e.kind == EventKind::Step) minflt.push_back(e.minflt), majflt.push_back(e.majflt);
  }
  nlohmann::json totals = nlohmann::json::object();
  for (const auto& [k, t] : p.totals()) totals[k] = {t.count, t.ns, t.bytes};
  nlohmann::json alloc;
  if (p.device().is_host()) {
    const AllocatorStats a = allocator_stats();
    alloc = {a.reserved_bytes, a.peak_in_use_bytes, a.cached_bytes, a.in_use_bytes};
  } else {
    const DeviceAllocatorStats a = device_allocator(p.device()).stats();
    alloc = {a.reserved_bytes, a.peak_in_use_bytes, a.cached_bytes, a.in_use_bytes};
  }
  return {{"rank", p.rank()}, {"events", events}, {"texts", p.texts()}, {"totals", totals}, {"minflt", minflt},
          {"majflt", majflt}, {"alloc", alloc},
          {"device", p.device().is_host() ? std::string() : p.device().to_string()}};
}

std::string mib(int64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

}  // namespace

std::string_view event_kind_name(EventKind k) {
  switch (k) {
    case EventKind::Step: return "step";
    case EventKind::Eval: return "eval";
    case EventKind::Op: return "op";
    case EventKind::Fill: return "fill";
    case EventKind::Reshard: return "reshard";
    case EventKind::Collective: return "collective";
    case EventKind::Optimizer: return "optimizer";
  }
  return "?";
}

void RankProfile::start(comm::Communicator& world) {
  origin_ns_ = 0;
  int64_t t = now_ns();
  world.all_reduce(&t, &t, 1, DType::I64, comm::Reduce::Min);
  origin_ns_ = t;
}

RankProfile::RankProfile(int rank) : rank_(rank) {
  static std::atomic<uint64_t> next{1};
  serial_ = next++;
}

int32_t RankProfile::intern(std::string_view text) {
  auto [it, added] = ids_.try_emplace(std::string(text), static_cast<int32_t>(texts_.size()));
  if (added) texts_.emplace_back(text);
  return it->second;
}

void RankProfile::record(const ProfileEvent& e) {
  TypeTotal& t = totals_[{e.kind, one_type(e.kind) ? -1 : e.name}];
  ++t.count;
  t.ns += e.dur_ns;
  t.bytes += e.bytes;
  events_.push_back(e);
}

std::map<std::string, TypeTotal> RankProfile::totals() const {
  std::map<std::string, TypeTotal> out;
  for (const auto& [key, t] : totals_) {
    std::string name(event_kind_name(key.first));
    out[key.second < 0 ? name : name + " " + text(key.second)] = t;
  }
  return out;
}

RankProfile* active_profile() { return current; }

ActiveProfile::ActiveProfile(RankProfile* p) : previous_(current) { current = p; }
ActiveProfile::~ActiveProfile() { current = previous_; }

ProfileScope::ProfileScope(RankProfile* p, EventKind kind, std::string_view name, int64_t bytes,
                           std::string_view detail)
    : p_(p) {
  if (!p_) return;
  e_.kind = kind;
  e_.name = p_->intern(name);
  if (!detail.empty()) e_.detail = p_->intern(detail);
  e_.bytes = bytes;
  if (kind == EventKind::Step || kind == EventKind::Eval) thread_faults(e_.minflt, e_.majflt);
  e_.start_ns = p_->now_ns();
}

ProfileScope::~ProfileScope() {
  if (!p_) return;
  e_.dur_ns = p_->now_ns() - e_.start_ns;
  if (e_.minflt >= 0) {
    int64_t minflt = 0, majflt = 0;
    thread_faults(minflt, majflt);
    e_.minflt = minflt - e_.minflt;
    e_.majflt = majflt - e_.majflt;
  }
  p_->record(e_);
}

ProfileReport gather_profile(const RankProfile& p, comm::Communicator& world) {
  const std::string text = to_json(p).dump();
  auto all = world.all_gather_bytes(std::as_bytes(std::span(text.data(), text.size())));
  ProfileReport r;
  r.one_process = world.backend() == "local";
  if (world.rank() != 0) return r;
  for (const auto& bytes : all) {
    auto j = nlohmann::json::parse(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
    RankSummary s;
    s.rank = j["rank"];
    for (const auto& [k, v] : j["totals"].items()) s.totals[k] = {v[0], v[1], v[2]};
    s.step_minflt = j["minflt"].get<std::vector<int64_t>>();
    s.step_majflt = j["majflt"].get<std::vector<int64_t>>();
    const auto& a = j["alloc"];
    s.reserved_bytes = a[0], s.peak_in_use_bytes = a[1], s.cached_bytes = a[2], s.in_use_bytes = a[3];
    s.device = j["device"].get<std::string>();
    std::vector<ProfileEvent> events;
    for (const auto& e : j["events"]) {
      events.push_back({kKinds[e[0].get<int>()], e[1], e[2], e[3], e[4], e[5], e[6], e[7]});
    }
    r.ranks.push_back(std::move(s));
    r.events.push_back(std::move(events));
    r.texts.push_back(j["texts"].get<std::vector<std::string>>());
  }
  return r;
}

void write_chrome_trace(const ProfileReport& r, const std::string& path) {
  nlohmann::json events = nlohmann::json::array();
  for (size_t i = 0; i < r.ranks.size(); ++i) {
    const int rank = r.ranks[i].rank;
    // One track per rank: a thread of process 0 named after the rank, sorted by rank.
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", 0}, {"tid", rank},
                      {"args", {{"name", fmt::format("rank {}", rank)}}}});
    events.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", 0}, {"tid", rank}, {"args", {{"sort_index", rank}}}});
    const std::vector<std::string>& texts = r.texts[i];
    for (const ProfileEvent& e : r.events[i]) {
      nlohmann::json args = nlohmann::json::object();
      if (e.bytes > 0 || e.kind == EventKind::Collective) args["bytes"] = e.bytes;
      if (e.detail >= 0) args["detail"] = texts[static_cast<size_t>(e.detail)];
      if (e.kind == EventKind::Step) args["minflt"] = e.minflt, args["majflt"] = e.majflt;
      events.push_back({{"ph", "X"}, {"name", texts[static_cast<size_t>(e.name)]}, {"cat", event_kind_name(e.kind)}, {"pid", 0}, {"tid", rank},
                        {"ts", static_cast<double>(e.start_ns) / 1e3}, {"dur", static_cast<double>(e.dur_ns) / 1e3},
                        {"args", args}});
    }
  }
  nlohmann::json trace = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  std::ofstream f(path);
  SW_CHECK(f.good(), "--profile: cannot write the trace {}: {} (the run's results are kept)", path, std::strerror(errno));
  f << trace.dump() << "\n";
  SW_CHECK(f.good(), "--profile: writing the trace {} failed: {} (the run's results are kept)", path, std::strerror(errno));
}

std::string format_profile(const ProfileReport& r) {
  if (r.ranks.empty()) return "";
  std::map<std::string, TypeTotal> sum;
  int64_t first_min = 0, first_maj = 0, later_min = 0, later_maj = 0;
  size_t steps = 0;
  for (const RankSummary& s : r.ranks) {
    for (const auto& [k, t] : s.totals) {
      TypeTotal& a = sum[k];
      a.count += t.count, a.ns += t.ns, a.bytes += t.bytes;
    }
    steps = std::max(steps, s.step_minflt.size());
    for (size_t i = 0; i < s.step_minflt.size(); ++i) {
      (i == 0 ? first_min : later_min) += s.step_minflt[i];
      (i == 0 ? first_maj : later_maj) += s.step_majflt[i];
    }
  }
  const auto nranks = static_cast<double>(r.ranks.size());
  const TypeTotal step = sum.count("step") ? sum["step"] : TypeTotal{};
  const double step_ms = static_cast<double>(step.ns) / 1e6;
  auto pct = [&](int64_t ns) { return step.ns > 0 ? 100.0 * static_cast<double>(ns) / static_cast<double>(step.ns) : 0.0; };
  std::string out = fmt::format("profile: {} on {}, {:.2f} ms per step (mean over ranks)\n",
                                counted(step.count / std::max<int64_t>(1, static_cast<int64_t>(r.ranks.size())), "step"),
                                counted(static_cast<int64_t>(r.ranks.size()), "rank"),
                                step.count > 0 ? step_ms / static_cast<double>(step.count) : 0.0);
  // Types by time, largest first (steps and evaluations are the totals, listed above).
  std::vector<std::pair<std::string, TypeTotal>> rows;
  int64_t gemm_ns = 0;
  for (const auto& [k, t] : sum) {
    if (k == "step" || k == "eval") continue;
    rows.emplace_back(k, t);
    if (k == "op matmul" || k == "op matmul_grad") gemm_ns += t.ns;
  }
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  using A = TextTable::Align;
  TextTable table({A::Left, A::Right, A::Right, A::Right, A::Right, A::Left}, "  ");
  table.row({"type (all ranks)", "count", "ms", "ms/step", "% step", "bytes (out / sent)"});
  const double per_step = step.count > 0 ? nranks / static_cast<double>(step.count) : 0.0;  // steps per rank
  size_t shown = 0;
  TypeTotal rest;
  for (const auto& [k, t] : rows) {
    const bool collective = k.rfind("collective ", 0) == 0;
    if (shown >= 14 && !collective) {
      rest.count += t.count, rest.ns += t.ns;
      continue;
    }
    ++shown;
    const double ms = static_cast<double>(t.ns) / 1e6;
    table.row({k, std::to_string(t.count), fmt::format("{:.3f}", ms), fmt::format("{:.3f}", ms * per_step / nranks),
               fmt::format("{:.1f}%", pct(t.ns)), t.bytes > 0 ? mib(t.bytes) : ""});
  }
  if (rest.count > 0) {
    const double ms = static_cast<double>(rest.ns) / 1e6;
    table.row({"(other types)", std::to_string(rest.count), fmt::format("{:.3f}", ms),
               fmt::format("{:.3f}", ms * per_step / nranks), fmt::format("{:.1f}%", pct(rest.ns))});
  }
  out += table.str();
  out += "  (a reshard's time includes its collectives'; the optimizer's its own collectives')\n";
  out += fmt::format("  GEMM (matmul and matmul_grad kernels): {:.1f}% of step time\n", pct(gemm_ns));
  int64_t coll_n = 0, coll_ns = 0, coll_bytes = 0;
  for (const auto& [k, t] : sum)
    if (k.rfind("collective ", 0) == 0) coll_n += t.count, coll_ns += t.ns, coll_bytes += t.bytes;
  out += fmt::format("  collectives: {}, {}, {:.1f}% of step time\n", counted(coll_n, "call"), mib(coll_bytes), pct(coll_ns));
  // The allocator is one per process: threads share one; MPI processes each have theirs (largest shown).
  const RankSummary* a = &r.ranks[0];
  for (const RankSummary& s : r.ranks)
    if (s.reserved_bytes > a->reserved_bytes) a = &s;
  out += fmt::format("  {}{}: reserved {}, peak in use {}, cached {}\n",
                     a->device.empty() ? std::string("allocator") : fmt::format("device allocator ({})", a->device),
                     r.one_process ? "" : fmt::format(" (largest of {} processes: rank {})", r.ranks.size(), a->rank),
                     mib(a->reserved_bytes), mib(a->peak_in_use_bytes), mib(a->cached_bytes));
  const double later = steps > 1 ? static_cast<double>(later_min) / static_cast<double>(steps - 1) : 0.0;
  out += fmt::format("  page faults (all rank threads): first step {} minor, {} major; later steps {:.0f} minor, {:.1f} major per step\n",
                     first_min, first_maj, later,
                     steps > 1 ? static_cast<double>(later_maj) / static_cast<double>(steps - 1) : 0.0);
  return out;
}

}  // namespace shardwise::runtime
