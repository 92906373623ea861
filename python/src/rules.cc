// The op registry, its SPMD rules and reshard plans from Python: shardwise.ops(), infer(),
// plan_reshard(), run_op(). Everything is read from the C++ registry, so an op registered in C++
// appears here with no Python written for it.
#include <fmt/format.h>

#include <chrono>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "arrays.h"
#include "errors.h"
#include "layouts.h"
#include "shardwise/ops/ask_rule.h"
#include "shardwise/reshard/plan.h"

namespace shardwise::py {
namespace {

using mesh::DistAttr;

struct OpInfo {
  std::string name, family, rule, summary;
  int num_inputs = 0, num_outputs = 0;
  bool has_grad = false;
  std::vector<ops::VerifyCase> cases;
};

nb::object attr_value(const AttrValue& v) {
  return std::visit([](const auto& x) -> nb::object { return nb::cast(x); }, v);
}

nb::list cases_of(const OpInfo& o) {
  nb::list out;
  for (const ops::VerifyCase& c : o.cases) {
    nb::list shapes, dtypes;
    for (size_t i = 0; i < c.shapes.size(); ++i) {
      shapes.append(shape_tuple(c.shapes[i]));
      dtypes.append(std::string(dtype_name(i < c.dtypes.size() ? c.dtypes[i] : DType::F32)));
    }
    nb::dict attrs;
    for (const auto& [k, v] : c.attrs.items()) attrs[k.c_str()] = attr_value(v);
    nb::dict item;
    item["shapes"] = shapes;
    item["dtypes"] = dtypes;
    item["attrs"] = attrs;
    item["attrs_text"] = c.attrs.to_string();
    out.append(item);
  }
  return out;
}

nb::list placements_list(const std::vector<DistAttr>& dists) {
  nb::list out;
  for (const DistAttr& d : dists) out.append(nb::cast(d));
  return out;
}

std::vector<ops::TensorMeta> metas_of(nb::handle shapes, nb::handle dtypes) {
  std::vector<ops::TensorMeta> metas;
  for (nb::handle s : shapes) metas.push_back({shape_of(s, "shape"), DType::F32});
  if (!dtypes.is_none()) {
    auto names = nb::cast<std::vector<std::string>>(dtypes);
    SW_CHECK(names.size() == metas.size(), "{} dtypes for {} inputs", names.size(), metas.size());
    for (size_t i = 0; i < names.size(); ++i) metas[i].dtype = parse_dtype(names[i]);
  }
  return metas;
}

// infer's question (and the bench's: the same conversions, so it times the same C++ question).
ops::RuleQuestion question_of(const std::string& op, const std::string& part, nb::handle mesh_spec, nb::handle shapes,
                              nb::handle placements, nb::handle attrs, nb::handle dtypes) {
  ops::RuleQuestion q{op, part, mesh_of(mesh_spec), metas_of(shapes, dtypes), {}, attrs_of(attrs)};
  size_t i = 0;
  for (nb::handle p : placements) q.placements.push_back(dist_of(p, q.mesh.ndim(), fmt::format("placements[{}]", i++)));
  return q;
}

void bind_answer(nb::module_& m) {
  nb::class_<ops::RuleAnswer>(m, "RuleAnswer", "What an op's rule answered (see infer).")
      .def_ro("op", &ops::RuleAnswer::op)
      .def_ro("part", &ops::RuleAnswer::part)
      .def_ro("rule", &ops::RuleAnswer::rule, "The name of the rule the op holds.")
      .def_prop_ro("inputs", [](const ops::RuleAnswer& a) { return placements_list(a.result.inputs); },
                   "Placements the rule requires of its inputs (grad: inputs, outputs, output grads).")
      .def_prop_ro("outputs", [](const ops::RuleAnswer& a) { return placements_list(a.result.outputs); },
                   "Placements of the outputs (grad: of the input gradients).")
      .def("__repr__", [](const ops::RuleAnswer& a) {
        std::vector<std::string> in, out;
        for (const auto& d : a.result.inputs) in.push_back(d.to_string());
        for (const auto& d : a.result.outputs) out.push_back(d.to_string());
        return fmt::format("RuleAnswer(op='{}', part='{}', rule='{}', inputs=[{}], outputs=[{}])", a.op, a.part, a.rule,
                           fmt::join(in, "; "), fmt::join(out, "; "));
      });
}

void bind_plan(nb::module_& m) {
  nb::class_<reshard::Step>(m, "ReshardStep", "One step of a reshard plan.")
      .def_prop_ro("kind", [](const reshard::Step& s) { return std::string(reshard::step_kind_name(s.kind)); })
      .def_ro("mesh_dim", &reshard::Step::mesh_dim)
      .def_ro("tensor_dim", &reshard::Step::tensor_dim)
      .def_ro("to_tensor_dim", &reshard::Step::to_tensor_dim)
      .def_prop_ro("reduce_op", [](const reshard::Step& s) { return std::string(mesh::reduce_op_name(s.op)); })
      .def_ro("group_dims", &reshard::Step::group_dims)
      .def_prop_ro("before", [](const reshard::Step& s) { return s.before.dist; })
      .def_prop_ro("after", [](const reshard::Step& s) { return s.after.dist; })
      .def_ro("bytes", &reshard::Step::bytes, "Bytes sent by the busiest rank.")
      .def_ro("cost_s", &reshard::Step::cost_s, "Estimated seconds (alpha-beta model).")
      .def("__str__", &reshard::Step::to_string)
      .def("__repr__", [](const reshard::Step& s) { return fmt::format("ReshardStep('{}')", s.to_string()); });
  nb::class_<reshard::Plan>(m, "ReshardPlan", "How a tensor moves from one layout to another.")
      .def_ro("steps", &reshard::Plan::steps)
      .def_ro("bytes", &reshard::Plan::bytes)
      .def_ro("cost_s", &reshard::Plan::cost_s)
      .def_ro("strategy", &reshard::Plan::strategy, "'collectives', 'redistribute', 'send_recv' or 'none'.")
      .def("__str__", &reshard::Plan::to_string)
      .def("__repr__", [](const reshard::Plan& p) {
        return fmt::format("ReshardPlan({} -> {}, {} steps, {} bytes, {:.3g} s)", p.from.to_string(), p.to.to_string(),
                           p.steps.size(), p.bytes, p.cost_s);
      });
}

}  // namespace

void bind_rules(nb::module_& m) {
  nb::class_<OpInfo>(m, "OpInfo", "A registered op.")
      .def_ro("name", &OpInfo::name)
      .def_ro("family", &OpInfo::family, "The folder ops/<family>/ that defines it.")
      .def_ro("rule", &OpInfo::rule, "Its SPMD rule's name.")
      .def_ro("summary", &OpInfo::summary)
      .def_ro("num_inputs", &OpInfo::num_inputs, "-1: any number >= 1.")
      .def_ro("num_outputs", &OpInfo::num_outputs, "-1: as many as shape inference returns.")
      .def_ro("has_grad", &OpInfo::has_grad)
      .def_prop_ro("cases", &cases_of,
                   "The cases the numerical verifier runs: dicts of shapes, dtypes, attrs (and attrs_text, as the "
                   "CLI's --attrs takes them).")
      .def("__repr__", [](const OpInfo& o) { return fmt::format("OpInfo('{}', family='{}')", o.name, o.family); });
  m.def("ops", [] {
    std::vector<OpInfo> out;
    for (const ops::OpDef* op : ops::op_registry().all()) {
      out.push_back({op->name, op->family, op->rule.name, op->summary, op->num_inputs, op->num_outputs,
                     op->has_backward(), op->cases});
    }
    return out;
  }, "Every registered op, sorted by family, then name.");
  bind_answer(m);
  m.def("infer", [](const std::string& op, nb::handle mesh_spec, nb::handle shapes, nb::handle placements,
                    nb::handle attrs, const std::string& part, nb::handle dtypes) {
    return raising(ErrorKind::Usage,
                   [&] { return ops::ask_rule(question_of(op, part, mesh_spec, shapes, placements, attrs, dtypes)); });
  }, nb::arg("op"), nb::arg("mesh"), nb::arg("shapes"), nb::arg("placements"), nb::arg("attrs") = nb::none(),
        nb::arg("part") = "forward", nb::arg("dtypes") = nb::none(),
        "Asks an op's SPMD rule: forward (placements: one per input), reverse (one per output) or grad (one per "
        "input, then one per output grad). Returns the required input and the output placements, as "
        "`shardwise infer` does.");
  m.def("_seconds_per_ask_rule", [](const std::string& op, nb::handle mesh_spec, nb::handle shapes, nb::handle placements,
                                     int64_t repeat) {
    const ops::RuleQuestion q = question_of(op, "forward", mesh_spec, shapes, placements, nb::none(), nb::none());
    auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < repeat; ++i) ops::ask_rule(q);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / static_cast<double>(repeat);
  }, "For bench/python_call_overhead.py: the C++ time of one forward rule question, without Python.");
  bind_plan(m);
  m.def("plan_reshard", [](nb::handle shape, nb::handle mesh_spec, nb::handle src, nb::handle dst, nb::handle dst_mesh,
                           const std::string& dtype, double alpha_us, double bandwidth_gbps, const std::string& strategy) {
    return raising(ErrorKind::Usage, [&] {
      SW_CHECK(alpha_us > 0 && bandwidth_gbps > 0, "alpha_us and bandwidth_gbps must be positive, got {} and {}",
               alpha_us, bandwidth_gbps);
      SW_CHECK(strategy == "auto" || strategy == "collectives" || strategy == "redistribute",
               "strategy '{}' is not one of auto, collectives, redistribute", strategy);
      reshard::Layout from{mesh_of(mesh_spec), {}};
      from.dist = dist_of(src, from.mesh.ndim(), "src");
      reshard::Layout to{dst_mesh.is_none() ? from.mesh : mesh_of(dst_mesh), {}};
      to.dist = dist_of(dst, to.mesh.ndim(), "dst");
      reshard::CostModel cost;
      cost.alpha_s = cost.p2p_alpha_s = alpha_us * 1e-6;
      cost.bandwidth_Bps = cost.p2p_bandwidth_Bps = bandwidth_gbps * 1e9;
      reshard::PlanOptions options;
      if (strategy == "collectives") options.strategy = reshard::PlanOptions::Strategy::Collectives;
      if (strategy == "redistribute") options.strategy = reshard::PlanOptions::Strategy::Redistribute;
      return reshard::plan_reshard(shape_of(shape, "shape"), parse_dtype(dtype), from, to, cost, options);
    });
  }, nb::arg("shape"), nb::arg("mesh"), nb::arg("src"), nb::arg("dst"), nb::arg("dst_mesh") = nb::none(),
        nb::arg("dtype") = "f32", nb::arg("alpha_us") = 5.0, nb::arg("bandwidth_gbps") = 10.0,
        nb::arg("strategy") = "auto",
        "The cheapest plan moving a tensor of `shape` from `src` placements on `mesh` to `dst` (on `dst_mesh`, "
        "default the same mesh): its steps, bytes and estimated cost, as `shardwise plan-reshard`.");
  m.def("run_op", [](const std::string& name, const std::vector<AnyArray>& inputs, nb::handle attrs) {
    const ops::OpDef& op = raising(ErrorKind::Usage, [&]() -> const ops::OpDef& { return ops::op_registry().get(name); });
    for (const AnyArray& array : inputs) {
      if (device_name(array) != "host") return run_device_op(name, inputs);
    }
    std::vector<Tensor> in;
    Attrs a;
    raising(ErrorKind::Usage, [&] {
      for (size_t i = 0; i < inputs.size(); ++i) in.push_back(tensor_from(inputs[i], fmt::format("{} input {}", name, i), "run_op (CPU kernels)"));
      a = attrs_of(attrs);
    });
    std::vector<Tensor> out = raising(ErrorKind::Usage, [&] {
      nb::gil_scoped_release release;
      std::vector<ops::TensorMeta> metas;
      for (const Tensor& t : in) metas.push_back({t.shape(), t.dtype()});
      ops::infer_checked(op, metas, a);
      return ops::run_forward(op, in, a);
    });
    nb::list result;
    for (const Tensor& t : out) result.append(array_from(t));
    return nb::object(result);
  }, nb::arg("op"), nb::arg("inputs"), nb::arg("attrs") = nb::none(),
        "Runs an op's CPU kernel on one device. Inputs are read in place (contiguous arrays, no copy); the outputs "
        "are NumPy arrays over shardwise's buffers (no copy). Inputs on a GPU run the op's CUDA kernel where the "
        "package has one (gelu, silu), giving outputs on that GPU; other ops refuse them.");
}

}  // namespace shardwise::py
