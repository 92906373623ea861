#include "shardwise/plan/search.h"

#include <fmt/format.h>

#include "shardwise/core/error.h"

namespace shardwise::plan {

std::string Candidate::mesh() const {
  std::string out;
  for (auto [name, size] : {std::pair{"pp", pp}, {"dp", dp}, {"ep", ep}, {"cp", cp}, {"tp", tp}}) {
    if (size > 1) out += fmt::format("{}{}={}", out.empty() ? "" : ",", name, size);
  }
  return out.empty() ? "dp=1" : out;
}

std::string Candidate::describe() const {
  std::string out = fmt::format("{}{} stage {} recompute {} micro-batch {} x {}", mesh(), sequence_parallel ? " sp" : "",
                                sharding_stage, recompute, micro_batch, accumulation);
  if (pp > 1) out += " " + schedule + (virtual_stages > 1 ? fmt::format(" v{}", virtual_stages) : "");
  return out;
}

std::string rejecting_rule(const SearchSpace& s, const Candidate& c) {
  if (s.heads % c.tp != 0 || s.kv_heads % c.tp != 0) return "tp-heads";
  if (s.vocab % c.tp != 0 || s.hidden % c.tp != 0 || s.mlp_width % c.tp != 0) return "tp-sizes";
  if (s.devices_per_node % c.tp != 0) return "tp-node";
  if (c.pp * c.virtual_stages > s.layers) return "pp-layers";
  if (c.ep > 1 && (s.experts == 0 || s.experts % c.ep != 0)) return "ep-experts";
  if (c.sequence_parallel && (c.tp == 1 || s.seq % c.tp != 0)) return "sp-tp";
  if (c.cp > 1 && (s.seq % (2 * c.cp) != 0 || s.experts > 0 || c.sharding_stage == 3 || s.seq / c.cp < kMinCpTokens))
    return "cp";
  const int64_t data = c.dp * c.ep;
  if (s.global_batch % data != 0 || (s.global_batch / data) % c.micro_batch != 0) return "batch";
  const int64_t micro_batches = s.global_batch / data / c.micro_batch;
  if (c.pp == 1 && c.schedule != "1f1b") return "pp-schedule";
  if (c.pp > 1 && (micro_batches < c.pp || (c.schedule == "interleaved" && micro_batches % c.pp != 0)))
    return "pp-schedule";
  if (c.sharding_stage > 0 && data * c.cp == 1) return "sharding";  // the gradients' ranks: dp, ep and cp
  return "";
}

namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

void check_space(const SearchSpace& s) {
  for (auto [name, v] : {std::pair{"devices", s.devices}, {"devices per node", s.devices_per_node}, {"layers", s.layers},
                         {"heads", s.heads}, {"kv heads", s.kv_heads}, {"hidden", s.hidden}, {"MLP width", s.mlp_width},
                         {"vocab", s.vocab}, {"seq", s.seq}, {"global batch", s.global_batch}}) {
    SW_CHECK(v >= 1, "plan --auto: {} must be at least 1, got {}", name, v);
  }
  SW_CHECK(s.experts >= 0, "plan --auto: experts must not be negative, got {}", s.experts);
  SW_CHECK(!s.sharding_stages.empty() && !s.recompute.empty() && !s.schedules.empty(),
           "plan --auto: nothing to search (no sharding stage, recompute or schedule given)");
}

// Every mesh (dp, tp, pp, ep, cp) whose product is the devices.
std::vector<Candidate> meshes(const SearchSpace& s) {
  const std::vector<int64_t> ds = divisors(s.devices);
  std::vector<Candidate> out;
  Candidate c;
  for (int64_t tp : ds)
    for (int64_t pp : ds)
      for (int64_t ep : ds)
        for (int64_t cp : s.context_parallel ? ds : std::vector<int64_t>{1}) {
          if (s.devices % (tp * pp * ep * cp) != 0) continue;
          c.tp = tp, c.pp = pp, c.ep = ep, c.cp = cp, c.dp = s.devices / (tp * pp * ep * cp);
          out.push_back(c);
        }
  return out;
}

}  // namespace

Enumeration enumerate_candidates(const SearchSpace& s) {
  check_space(s);
  Enumeration e;
  std::vector<int64_t> micro;
  for (int64_t m : divisors(s.global_batch))
    if (s.max_micro_batch == 0 || m <= s.max_micro_batch) micro.push_back(m);
  const std::vector<bool> sps = s.sequence_parallel ? std::vector<bool>{false, true} : std::vector<bool>{false};
  for (Candidate c : meshes(s)) {
    for (bool sp : sps) {
      c.sequence_parallel = sp;
      for (const std::string& schedule : s.schedules) {
        c.schedule = schedule;
        c.virtual_stages = schedule == "interleaved" ? 2 : 1;
        for (int stage : s.sharding_stages) {
          c.sharding_stage = stage;
          for (const std::string& rc : s.recompute) {
            c.recompute = rc;
            for (int64_t m : micro) {
              c.micro_batch = m;
              c.accumulation = s.global_batch % (c.dp * c.ep * m) == 0 ? s.global_batch / (c.dp * c.ep * m) : 0;
              ++e.considered;
              const std::string rule = rejecting_rule(s, c);
              if (rule.empty()) e.kept.push_back(c);
              else ++e.removed[rule];
            }
          }
        }
      }
    }
  }
  return e;
}

}  // namespace shardwise::plan
