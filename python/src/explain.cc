// A traced graph's sharding from Python (shardwise.graph.Graph.explain / plan): the graph with its
// backward, completed on its mesh and lowered, as `shardwise plan` does for the built-in models.
#include <fmt/format.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "errors.h"
#include "graph.h"
#include "shardwise/graph/autodiff.h"
#include "shardwise/graph/completion.h"
#include "shardwise/graph/program.h"

namespace shardwise::py {
namespace {

// A copy of the traced graph with its backward, completed on its mesh.
struct Completed {
  graph::Graph g;
  graph::Completion done;
};

Completed complete_traced(const PyGraph& pg, int loss) {
  Completed c{*pg.g, {}};
  graph::append_backward(c.g, loss);
  c.done = graph::complete(c.g, pg.strategy.mesh);
  return c;
}

}  // namespace

void bind_explain(nb::module_& m) {
  m.def("_explain", [](const PyGraph& pg, int loss, const std::vector<std::string>& names) {
    return raising(ErrorKind::Usage, [&] {
      Completed c = complete_traced(pg, loss);
      std::vector<std::string> out;
      for (const std::string& name : names) out.push_back(graph::explain(c.g, c.done, c.g.get(name)));
      return out;
    });
  }, nb::arg("graph"), nb::arg("loss"), nb::arg("names"),
     "Why each named value got its placement (`shardwise plan --explain`), the backward included.");
  m.def("_plan", [](const PyGraph& pg, int loss, bool summary) {
    return raising(ErrorKind::Usage, [&] {
      Completed c = complete_traced(pg, loss);
      graph::Program p = graph::lower(c.g, c.done);
      if (!summary) return p.to_string(c.g);
      std::string line = fmt::format("reshards: {:.3g} us estimated, {} B sent by the busiest rank; collectives:",
                                     p.reshard_cost_s * 1e6, p.reshard_bytes);
      for (auto& [kind, count] : p.collective_counts()) line += fmt::format(" {} x{}", kind, count);
      return line;
    });
  }, nb::arg("graph"), nb::arg("loss"), nb::arg("summary") = false,
     "The lowered program (`shardwise plan`), or its reshard and collective summary (`plan --summary`).");
}

}  // namespace shardwise::py
