#include "harness.h"

#include "shardwise/graph/completion.h"

namespace shardwise::testing_support {

RunResult run_graph(const std::function<void(graph::Graph&)>& build, const mesh::ProcessMesh& mesh,
                    const std::map<std::string, Tensor>& data, const std::string& loss,
                    const std::vector<std::string>& outputs) {
  graph::Graph g;
  build(g);
  graph::append_backward(g, g.get(loss));
  graph::Completion c = graph::complete(g, mesh);
  RunResult result;
  result.program = graph::lower(g, c);
  result.plan = result.program.to_string(g);
  const int n = static_cast<int>(mesh.size());
  std::vector<std::map<std::string, Tensor>> values(static_cast<size_t>(n)), grads(static_cast<size_t>(n));
  result.stats.resize(static_cast<size_t>(n));
  comm::LocalWorld::run(n, [&](comm::Communicator& world) {
    runtime::Runtime rt(g, result.program, world.group(world.members()));
    for (const auto& [name, t] : data) rt.set_global(name, t);
    for (const auto& name : outputs) rt.keep(name);
    rt.run();
    auto r = static_cast<size_t>(world.rank());
    result.stats[r] = rt.stats();
    for (const auto& name : outputs) values[r][name] = rt.gather(name);
    for (graph::ValueId p : g.params()) grads[r][g.value(p).name] = rt.gather_grad(g.value(p).name);
  });
  // Every rank must hold the same gathered values.
  for (int r = 1; r < n; ++r) {
    for (const auto& [name, t] : values[0]) {
      CompareResult c = compare(values[static_cast<size_t>(r)][name], t);
      if (!c.equal) fail("rank {} gathered a different '{}': {}", r, name, c.message);
    }
  }
  result.values = values[0];
  result.grads = grads[0];
  return result;
}

}  // namespace shardwise::testing_support
