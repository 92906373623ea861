// Three functions bound with nanobind; run.sh rewrites this file into the same module bound with
// pybind11 (mod_pb) and compares the two.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

namespace nb = nanobind;

struct Placement {
  int kind = 0, dim = -1;
};

NB_MODULE(mod_nb, m) {
  nb::class_<Placement>(m, "Placement").def(nb::init<>()).def_rw("dim", &Placement::dim);
  m.def("noop", [](int a, int b, int c) { return a + b + c; });
  m.def("shape", [](const std::vector<int64_t>& s) { return static_cast<int64_t>(s.size()); });
  m.def("placements", [](const std::vector<Placement>& p, const std::string& op) {
    return static_cast<int>(p.size() + op.size());
  });
}
