// ns per SPMD rule call (forward rule) for elementwise, reduction and matmul rules on a [2,4] mesh.
#include <benchmark/benchmark.h>

#include "bench/rule_cases.h"

namespace {

void BM_Rule(benchmark::State& state, size_t index) {
  static const auto calls = shardwise::bench::rule_calls();
  const auto& c = calls[index];
  for (auto _ : state) {
    auto result = c.call();
    benchmark::DoNotOptimize(result);
  }
  state.SetLabel(c.label);
}

int register_all = [] {
  auto calls = shardwise::bench::rule_calls();
  for (size_t i = 0; i < calls.size(); ++i) {
    benchmark::RegisterBenchmark(("rule/" + calls[i].label).c_str(), BM_Rule, i);
  }
  return 0;
}();

}  // namespace

BENCHMARK_MAIN();
