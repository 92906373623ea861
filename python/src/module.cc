// shardwise._core: the native module under `import shardwise` (python/shardwise/__init__.py).
#include <nanobind/nanobind.h>

#include "checkpoint.h"
#include "errors.h"
#include "layouts.h"

namespace shardwise::py {
void bind_rules(nb::module_& m);
void bind_train(nb::module_& m);
void bind_generate(nb::module_& m);
void bind_graph(nb::module_& m);
void bind_reference(nb::module_& m);
void bind_explain(nb::module_& m);
void bind_devices(nb::module_& m);
}  // namespace shardwise::py

NB_MODULE(_core, m) {
  m.doc() = "shardwise's C++ core: layouts, SPMD rules, reshard plans, checkpoints, training.";
  shardwise::py::bind_errors(m);
  shardwise::py::bind_layouts(m);
  shardwise::py::bind_rules(m);
  shardwise::py::bind_checkpoint_groups(m);
  shardwise::py::bind_checkpoint_save(m);
  shardwise::py::bind_checkpoint_load(m);
  shardwise::py::bind_train(m);
  shardwise::py::bind_generate(m);
  shardwise::py::bind_graph(m);
  shardwise::py::bind_reference(m);
  shardwise::py::bind_explain(m);
  shardwise::py::bind_devices(m);
}
