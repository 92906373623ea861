// Plan time of the reshard planner (auto strategy: both candidate plans are built and costed) on
// 2-D and 3-D meshes, for a layer-sized tensor.
#include <benchmark/benchmark.h>

#include "shardwise/reshard/plan.h"

namespace {

using namespace shardwise;

void BM_Plan(benchmark::State& state, const char* from, const char* to) {
  reshard::Layout a = reshard::parse_layout(from), b = reshard::parse_layout(to);
  Shape shape{8, 1024, 4096};
  for (auto _ : state) {
    auto plan = reshard::plan_reshard(shape, DType::BF16, a, b);
    benchmark::DoNotOptimize(plan);
  }
  state.SetLabel(std::string(from) + " -> " + to);
}

BENCHMARK_CAPTURE(BM_Plan, 2d_partial_to_shard, "mesh=2x4 S(0),P", "mesh=2x4 R,S(2)");
BENCHMARK_CAPTURE(BM_Plan, 2d_swap_shards, "mesh=2x4 S(0),S(1)", "mesh=2x4 S(1),S(0)");
BENCHMARK_CAPTURE(BM_Plan, 2d_coshard_order, "mesh=2x4 S(1),S(1)", "mesh=2x4 S(1)@1,S(1)@0");
BENCHMARK_CAPTURE(BM_Plan, 3d_mixed, "mesh=2x2x2 S(0),S(1),P", "mesh=2x2x2 R,S(2),S(0)");
BENCHMARK_CAPTURE(BM_Plan, 3d_64_ranks_mixed, "mesh=2x4x8 S(0),S(1),P", "mesh=2x4x8 R,S(2),S(0)");
BENCHMARK_CAPTURE(BM_Plan, 3d_64_ranks_same, "mesh=2x4x8 S(0),R,S(2)", "mesh=2x4x8 S(0),R,S(2)");
BENCHMARK_CAPTURE(BM_Plan, between_stages, "mesh=2x4 ranks=0-7 S(0),S(2)", "mesh=2x4 ranks=8-15 S(0),S(2)");

}  // namespace

BENCHMARK_MAIN();
