#include "shardwise/graph/prefetch.h"

#include <algorithm>
#include <cctype>

namespace shardwise::graph {

std::string param_layer(std::string_view name) {
  size_t at = 0;
  while (at < name.size()) {
    size_t dot = name.find('.', at);
    size_t stop = dot == std::string_view::npos ? name.size() : dot;
    std::string_view part = name.substr(at, stop - at);
    if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
      return std::string(name.substr(0, stop));
    if (dot == std::string_view::npos) break;
    at = dot + 1;
  }
  return std::string(name);
}

bool prefetchable_gather(const Graph& g, const Program& p, const Instr& ins) {
  if (ins.kind != InstrKind::Reshard || ins.out.size() != 1 || ins.out[0] < 0) return false;
  const Slot& s = p.slots[static_cast<size_t>(ins.out[0])];
  if (s.value < 0 || g.value(s.value).kind != ValueKind::Param) return false;
  if (p.value_slot[static_cast<size_t>(s.value)] == ins.out[0]) return false;
  return ins.plan.steps.size() == 1 && ins.plan.steps[0].kind == reshard::StepKind::AllGather;
}

std::vector<std::vector<size_t>> prefetch_starts(const Graph& g, const Program& p, const std::vector<int>& order,
                                                 size_t begin, size_t end, int depth) {
  std::vector<std::vector<size_t>> starts(order.size());
  if (depth <= 0) return starts;
  end = std::min(end, order.size());
  // Units: runs of consecutive gathers of one layer, as positions.
  std::vector<std::vector<size_t>> units;
  std::string last;
  for (size_t pos = begin; pos < end; ++pos) {
    const Instr& ins = p.instrs[static_cast<size_t>(order[pos])];
    if (!prefetchable_gather(g, p, ins)) continue;
    std::string layer = param_layer(g.value(p.slots[static_cast<size_t>(ins.out[0])].value).name);
    if (units.empty() || layer != last) units.emplace_back();
    units.back().push_back(pos);
    last = std::move(layer);
  }
  size_t started = 0;  // units [0, started) are started
  for (size_t u = 0; u < units.size(); ++u) {
    std::vector<size_t>& here = starts[units[u].front()];
    for (; started < std::min(units.size(), u + 1 + static_cast<size_t>(depth)); ++started)
      here.insert(here.end(), units[started].begin(), units[started].end());
  }
  return starts;
}

}  // namespace shardwise::graph
