// The graph builder from Python: shardwise._Graph (parameters, inputs, any registered op by name,
// annotations), and python_model, the traced model the Trainer runs (models/custom.h).
#include "graph.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <mutex>
#include <nlohmann/json.hpp>
#include <tuple>

#include "arrays.h"
#include "errors.h"
#include "layouts.h"
#include "shardwise/mesh/cp_order.h"
#include "shardwise/mesh/dist_attr.h"

namespace shardwise::py {
namespace {

DType dtype_of(const std::string& name) { return parse_dtype(name); }

nb::tuple meta_tuple(const graph::Graph& g, graph::ValueId v) {
  const graph::Value& val = g.value(v);
  return nb::make_tuple(val.name, shape_tuple(val.meta.shape), std::string(dtype_name(val.meta.dtype)),
                        val.requires_grad);
}

PyGraph graph_on(nb::handle mesh_spec, bool sequence_parallel) {
  PyGraph pg;
  if (!mesh_spec.is_none()) pg.strategy = mesh::Strategy::from_mesh(mesh_of(mesh_spec), sequence_parallel);
  return pg;
}

struct PyModel {
  nb::handle build;  // borrowed: the Python Trainer keeps it alive
  std::string description;
  std::mutex mu;
  std::map<std::tuple<std::string, int64_t, int64_t, int, int64_t, int64_t, bool, bool, DType, uint64_t>,
           train::GptGraph>
      traced;
  std::vector<std::string> outputs;  // the names nn.output gave, in every predictions graph traced
  std::vector<train::CustomMoe> moe;  // the nn.MoE layers of every graph traced, in layer order
  std::map<std::string, train::ParamInit> inits;
  std::map<std::string, Tensor> constants;
  std::string tied;

  // `mode`: 0 the loss graph, 1 the training graph, 2 the predictions graph.
  train::GptGraph trace(const train::GptConfig& c, const mesh::Strategy& s, int64_t sequences, int mode,
                        const train::GptPart& part) {
    std::lock_guard lock(mu);
    const int64_t seq = c.seq;
    auto key = std::make_tuple(s.to_string(), sequences, seq, mode, part.first_layer, part.end_layer,
                               part.embeddings, part.head, c.param_dtype, c.dropout_seed);
    if (auto it = traced.find(key); it != traced.end()) return it->second;
    train::GptGraph out;
    {
      nb::gil_scoped_acquire gil;
      try {
        nb::object py = nb::cast(
            PyGraph{std::make_shared<graph::Graph>(), s, c.param_dtype, c.dropout_seed, {}, {}, c.cp_attention});
        nb::tuple part_tuple = nb::make_tuple(part.first_layer, part.end_layer, part.embeddings, part.head);
        using Moe = std::tuple<int64_t, std::string, int64_t>;
        auto [loss, input, output, output_grad, extra_loss, tied_name, named, moe_layers] =
            nb::cast<std::tuple<int, int, int, int, int, std::string, std::vector<std::string>, std::vector<Moe>>>(
                build(py, sequences, seq, mode == 1, part_tuple, mode == 2));
        for (const std::string& name : named)
          if (std::find(outputs.begin(), outputs.end(), name) == outputs.end()) outputs.push_back(name);
        for (const auto& [layer, op, experts] : moe_layers) {
          auto known = [&](const train::CustomMoe& m) { return m.op == op; };
          if (std::find_if(moe.begin(), moe.end(), known) == moe.end()) moe.push_back({layer, op, experts});
        }
        std::sort(moe.begin(), moe.end(), [](const auto& a, const auto& b) { return a.layer < b.layer; });
        PyGraph& pg = nb::cast<PyGraph&>(py);
        out.g = *pg.g;
        out.loss = loss, out.input = input, out.output = output, out.output_grad = output_grad;
        out.extra_loss = extra_loss;
        for (auto& [name, init] : pg.inits) inits[name] = init;
        for (auto& [name, value] : pg.constants) constants[name] = value;
        tied = tied_name;
      } catch (nb::python_error& e) {
        // The Python error's message (a shardwise.Error names the user's file and line; another
        // error gets its type and innermost line) as a usage error of the run.
        std::string message = nb::cast<std::string>(nb::module_::import_("shardwise.tracing").attr("error_text")(e.value()));
        throw KindedError(ErrorKind::Usage, message);
      }
    }
    return traced.emplace(key, std::move(out)).first->second;
  }
};

}  // namespace

std::shared_ptr<const train::CustomModel> python_model(nb::handle build, std::string description,
                                                       const std::string& config_json, std::vector<std::string> feeds,
                                                       std::shared_ptr<FedBatch> fed) {
  auto model = std::make_shared<PyModel>();
  model->build = build;
  model->description = description;
  auto custom = std::make_shared<train::CustomModel>();
  custom->description = std::move(description);
  if (!config_json.empty()) custom->config = nlohmann::json::parse(config_json);
  custom->build = [model](const train::GptConfig& c, const mesh::Strategy& s, int64_t sequences, bool training,
                          const train::GptPart& part) { return model->trace(c, s, sequences, training ? 1 : 0, part); };
  custom->predictions = [model](const train::GptConfig& c, const mesh::Strategy& s, int64_t sequences,
                                const train::GptPart& part) { return model->trace(c, s, sequences, 2, part); };
  custom->outputs = [model] {
    std::lock_guard lock(model->mu);
    return model->outputs;
  };
  custom->moe_layers = [model] {
    std::lock_guard lock(model->mu);
    return model->moe;
  };
  custom->tied = [model] {
    std::lock_guard lock(model->mu);
    return model->tied;
  };
  custom->init = [model](const std::string& name) {
    std::lock_guard lock(model->mu);
    auto it = model->inits.find(name);
    SW_CHECK(it != model->inits.end(), "{}: no initial value for the parameter '{}'", model->description, name);
    return it->second;
  };
  custom->constants = [model] {
    std::lock_guard lock(model->mu);
    return model->constants;
  };
  custom->feeds = std::move(feeds);
  if (!fed) fed = std::make_shared<FedBatch>();
  custom->batch = [fed, model](const std::string& name) {
    std::lock_guard lock(fed->mu);
    auto it = fed->tensors.find(name);
    SW_CHECK(it != fed->tensors.end(), "{}: no batch for the input '{}': pass it to Trainer.step(batch={{...}})",
             model->description, name);
    return it->second;
  };
  return custom;
}

void bind_graph(nb::module_& m) {
  nb::class_<PyGraph>(m, "_Graph", "A graph being built (shardwise.graph wraps it).")
      .def("__init__", [](PyGraph* self, nb::handle mesh, bool sp) {
        new (self) PyGraph(raising(ErrorKind::Usage, [&] { return graph_on(mesh, sp); }));
      }, nb::arg("mesh").none() = nb::none(), nb::arg("sequence_parallel") = false)
      .def("input", [](PyGraph& pg, const std::string& name, nb::handle shape, const std::string& dtype) {
        return raising(ErrorKind::Usage, [&] { return pg.g->input(name, shape_of(shape, name), dtype_of(dtype)); });
      }, nb::arg("name"), nb::arg("shape"), nb::arg("dtype") = "f32")
      .def("param", [](PyGraph& pg, const std::string& name, nb::handle shape, const std::string& dtype, double std,
                       double value) {
        return raising(ErrorKind::Usage, [&] {
          graph::ValueId v = pg.g->param(name, shape_of(shape, name), dtype_of(dtype));
          pg.inits[name] = train::ParamInit{std, value};
          return v;
        });
      }, nb::arg("name"), nb::arg("shape"), nb::arg("dtype") = "f32", nb::arg("std") = 0.0, nb::arg("value") = 0.0,
           "A trained parameter, initialised to normal(0, std) by name (std > 0) or to `value`.")
      .def("constant", [](PyGraph& pg, const std::string& name, const AnyArray& value) {
        return raising(ErrorKind::Usage, [&] {
          Tensor t = tensor_from(value, name, "Graph.constant").clone();
          graph::ValueId v = pg.g->input(name, t.shape(), t.dtype());
          pg.constants[name] = std::move(t);
          return v;
        });
      }, nb::arg("name"), nb::arg("value"), "An input bound once to a copy of `value` (an array) on every rank.")
      .def("op", [](PyGraph& pg, const std::string& op, const std::vector<int>& inputs, nb::handle attrs,
                    const std::string& name) {
        return raising(ErrorKind::Usage, [&] { return pg.g->op(op, inputs, attrs_of(attrs), name); });
      }, nb::arg("op"), nb::arg("inputs"), nb::arg("attrs").none() = nb::none(), nb::arg("name") = "")
      .def("meta", [](const PyGraph& pg, int v) {
        return raising(ErrorKind::Usage, [&] { return meta_tuple(*pg.g, v); });
      }, nb::arg("value"), "(name, shape, dtype, requires_grad) of a value.")
      .def("set_requires_grad", [](PyGraph& pg, int v, bool on) {
        raising(ErrorKind::Usage, [&] { pg.g->value(v).requires_grad = on; });
      }, nb::arg("value"), nb::arg("requires_grad"), "A pipeline stage's input takes a gradient (training).")
      .def("annotate", [](PyGraph& pg, int v, const std::string& placements) {
        raising(ErrorKind::Usage, [&] { pg.g->annotate(v, placements); });
      }, nb::arg("value"), nb::arg("placements"))
      .def("begin_segment", [](PyGraph& pg) { return pg.g->begin_segment(); })
      .def("end_segment", [](PyGraph& pg) { pg.g->end_segment(); })
      .def_prop_ro("mesh_dims", [](const PyGraph& pg) { return pg.strategy.mesh.dim_names(); })
      .def_prop_ro("mesh_shape", [](const PyGraph& pg) { return shape_tuple(pg.strategy.mesh.shape()); })
      .def_prop_ro("param_dtype", [](const PyGraph& pg) { return std::string(dtype_name(pg.param_dtype)); })
      .def_prop_ro("seed", [](const PyGraph& pg) { return pg.seed; })
      .def_prop_ro("sequence_parallel", [](const PyGraph& pg) { return pg.strategy.sequence_parallel; })
      .def_prop_ro("cp_size", [](const PyGraph& pg) { return pg.strategy.cp_size(); })
      .def_prop_ro("cp_attention", [](const PyGraph& pg) { return pg.cp_attention; })
      .def("positions", [](const PyGraph& pg, int64_t seq) {
        return raising(ErrorKind::Usage, [&] { return mesh::cp_balanced_order(seq, pg.strategy.cp_size()); });
      }, nb::arg("seq"), "The original position of each stored token of a sequence: 0 .. seq-1, or cp's balanced order.")
      .def_prop_ro("nodes", [](const PyGraph& pg) {
        std::vector<std::string> out;
        for (const graph::Node& n : pg.g->nodes()) out.push_back(n.to_string(*pg.g));
        return out;
      }, "Each node as text: 'h = matmul(x, w)'.");
}

}  // namespace shardwise::py
