// Completion (sharding propagation over the whole graph) of a 96-layer GPT, forward + backward,
// on a [dp=2, tp=4] mesh; and the other passes around it for scale.
#include <benchmark/benchmark.h>

#include "shardwise/graph/autodiff.h"
#include "shardwise/graph/program.h"
#include "shardwise/models/gpt.h"

namespace {

using namespace shardwise;

train::GptGraph model() {
  train::GptConfig c;
  c.layers = 96, c.hidden = 1024, c.heads = 16, c.seq = 1024, c.vocab = 50304;
  auto s = train::Strategy::from_mesh(mesh::parse_mesh("dp=2,tp=4"), false);
  train::GptGraph m = train::build_gpt(c, s, 8);
  graph::append_backward(m.g, m.loss);
  return m;
}

void BM_Complete(benchmark::State& state) {
  train::GptGraph m = model();
  auto mesh = mesh::parse_mesh("dp=2,tp=4");
  for (auto _ : state) benchmark::DoNotOptimize(graph::complete(m.g, mesh));
  state.SetLabel(fmt::format("{} nodes", m.g.nodes().size()));
}
BENCHMARK(BM_Complete)->Unit(benchmark::kMillisecond);

void BM_Lower(benchmark::State& state) {
  train::GptGraph m = model();
  auto mesh = mesh::parse_mesh("dp=2,tp=4");
  graph::Completion c = graph::complete(m.g, mesh);
  for (auto _ : state) benchmark::DoNotOptimize(graph::lower(m.g, c));
}
BENCHMARK(BM_Lower)->Unit(benchmark::kMillisecond);

void BM_BuildAndDifferentiate(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(model());
}
BENCHMARK(BM_BuildAndDifferentiate)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
