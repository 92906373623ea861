// The same three functions bound with pybind11 (mod_nb.cc: nanobind), for bench/binding_choice/run.sh.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

namespace nb = pybind11;

struct Placement {
  int kind = 0, dim = -1;
};

PYBIND11_MODULE(mod_pb, m) {
  nb::class_<Placement>(m, "Placement").def(nb::init<>()).def_readwrite("dim", &Placement::dim);
  m.def("noop", [](int a, int b, int c) { return a + b + c; });
  m.def("shape", [](const std::vector<int64_t>& s) { return static_cast<int64_t>(s.size()); });
  m.def("placements", [](const std::vector<Placement>& p, const std::string& op) {
    return static_cast<int>(p.size() + op.size());
  });
}
