#include "layouts.h"

#include <fmt/format.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "errors.h"
#include "shardwise/mesh/placement.h"
#include "shardwise/mesh/shard_math.h"

namespace shardwise::py {
namespace {

using mesh::DistAttr;
using mesh::Placement;
using mesh::ProcessMesh;

std::string placement_repr(const Placement& p) {
  if (p.is_shard()) return fmt::format("Shard({})", p.dim);
  if (p.is_partial()) return fmt::format("Partial('{}')", mesh::reduce_op_name(p.reduce));
  return "Replicate()";
}

std::string dist_repr(const DistAttr& d) {
  std::vector<std::string> items;
  for (const Placement& p : d.placements()) items.push_back(placement_repr(p));
  return fmt::format("Placements([{}])", fmt::join(items, ", "));
}

ProcessMesh make_mesh(nb::handle spec, nb::handle process_ids) {
  std::vector<int64_t> ids;
  if (!process_ids.is_none()) ids = nb::cast<std::vector<int64_t>>(process_ids);
  if (nb::isinstance<ProcessMesh>(spec)) {
    const auto& m = nb::cast<const ProcessMesh&>(spec);
    return ids.empty() ? m : ProcessMesh(m.shape(), ids, m.dim_names());
  }
  if (nb::isinstance<nb::str>(spec)) {
    ProcessMesh m = mesh::parse_mesh(nb::cast<std::string>(spec));
    return ids.empty() ? m : ProcessMesh(m.shape(), ids, m.dim_names());
  }
  std::vector<int64_t> dims;
  std::vector<std::string> names;
  if (nb::isinstance<nb::dict>(spec)) {
    for (auto [k, v] : nb::borrow<nb::dict>(spec)) {
      names.push_back(nb::cast<std::string>(k));
      dims.push_back(nb::cast<int64_t>(v));
    }
  } else {
    dims = nb::cast<std::vector<int64_t>>(spec);
  }
  SW_CHECK(!dims.empty(), "a mesh needs at least one dim");
  for (size_t i = 0; i < dims.size(); ++i) {
    SW_CHECK(dims[i] >= 1, "mesh dim {} ({}) has size {}; sizes are at least 1", i, names.empty() ? "" : names[i],
             dims[i]);
  }
  return ProcessMesh(Shape{std::span<const int64_t>(dims)}, ids, names);
}

void bind_placement(nb::module_& m) {
  nb::class_<Placement>(m, "Placement",
                        "Placement of a tensor on one mesh dim: Replicate(), Shard(tensor dim) or Partial(reduce op).")
      .def_prop_ro("kind",
                   [](const Placement& p) {
                     return p.is_shard() ? "shard" : p.is_partial() ? "partial" : "replicate";
                   })
      .def_prop_ro("dim", [](const Placement& p) -> nb::object {
        if (!p.is_shard()) return nb::none();
        return nb::int_(p.dim);
      }, "The tensor dim a Shard splits (None otherwise).")
      .def_prop_ro("reduce_op", [](const Placement& p) -> nb::object {
        if (!p.is_partial()) return nb::none();
        return nb::str(std::string(mesh::reduce_op_name(p.reduce)).c_str());
      }, "A Partial's reduce op: 'sum', 'avg', 'max' or 'min' (None otherwise).")
      .def("is_shard", [](const Placement& p, nb::handle dim) {
        return dim.is_none() ? p.is_shard() : p.is_shard(nb::cast<int>(dim));
      }, nb::arg("dim") = nb::none())
      .def("is_replicate", &Placement::is_replicate)
      .def("is_partial", [](const Placement& p) { return p.is_partial(); })
      .def("__eq__", [](const Placement& a, nb::handle b) {
        return nb::isinstance<Placement>(b) && a == nb::cast<const Placement&>(b);
      })
      .def("__hash__", [](const Placement& p) { return std::hash<std::string>()(p.to_string()); })
      .def("__repr__", &placement_repr)
      .def("__str__", &Placement::to_string);
  m.def("Replicate", [] { return Placement::replicate(); }, "Every rank along the mesh dim holds the whole tensor.");
  m.def("Shard", [](int dim) {
    SW_CHECK(dim >= 0, "Shard({}): the tensor dim must be 0 or more", dim);
    return Placement::shard(dim);
  }, nb::arg("dim"), "The mesh dim splits tensor dim `dim` into chunks (uneven and empty chunks allowed).");
  m.def("Partial", [](const std::string& op) { return Placement::partial(mesh::parse_reduce_op(op)); },
        nb::arg("reduce_op") = "sum", "Each rank holds a part; the value is their sum, avg, max or min.");
}

void bind_dist(nb::module_& m) {
  nb::class_<DistAttr>(m, "Placements",
                       "A tensor's placements, one per mesh dim (a co-sharded dim's split order is kept; printed as "
                       "S(0)@k when it differs from mesh-dim order).")
      .def("__init__", [](DistAttr* self, nb::handle spec) { new (self) DistAttr(dist_of(spec, -1, "placements")); },
           nb::arg("placements"))
      .def("__len__", &DistAttr::mesh_ndim)
      .def("__getitem__", [](const DistAttr& d, int i) {
        if (i < 0) i += d.mesh_ndim();
        if (i < 0 || i >= d.mesh_ndim()) throw nb::index_error();
        return d[i];
      })
      .def("__eq__", [](const DistAttr& a, nb::handle b) {
        if (nb::isinstance<DistAttr>(b)) return a == nb::cast<const DistAttr&>(b);
        try {
          return a == dist_of(b, a.mesh_ndim(), "placements");
        } catch (const Error&) {
          return false;
        }
      })
      .def("__repr__", &dist_repr)
      .def("__str__", &DistAttr::to_string)
      .def("shard_order", [](const DistAttr& d, int tensor_dim) {
        auto dims = d.mesh_dims_of(tensor_dim);
        return std::vector<int>(dims.begin(), dims.end());
      }, nb::arg("tensor_dim"), "The mesh dims splitting `tensor_dim`, in split order.");
  nb::implicitly_convertible<nb::list, DistAttr>();
  nb::implicitly_convertible<nb::tuple, DistAttr>();
  nb::implicitly_convertible<nb::str, DistAttr>();
}

void bind_mesh(nb::module_& m) {
  nb::class_<ProcessMesh>(m, "Mesh",
                          "An N-d arrangement of ranks, numbered row-major over its shape; process_ids[i] is the "
                          "process at rank index i (default 0..n-1).")
      .def("__init__", [](ProcessMesh* self, nb::handle spec, nb::handle ids) { new (self) ProcessMesh(make_mesh(spec, ids)); },
           nb::arg("shape"), nb::arg("process_ids") = nb::none(),
           "Mesh({'dp': 2, 'tp': 2}), Mesh([2, 2]) or Mesh('dp=2,tp=2'); process_ids optional.")
      .def_prop_ro("shape", [](const ProcessMesh& mm) { return shape_tuple(mm.shape()); })
      .def_prop_ro("ndim", &ProcessMesh::ndim)
      .def_prop_ro("size", &ProcessMesh::size)
      .def_prop_ro("dim_names", &ProcessMesh::dim_names)
      .def_prop_ro("process_ids", &ProcessMesh::process_ids)
      .def("dim_index", [](const ProcessMesh& mm, const std::string& name) { return mm.dim_index(name); },
           nb::arg("name"), "Index of a mesh dim by name ('tp') or number ('1').")
      .def("coords", &ProcessMesh::coords, nb::arg("rank_index"), "Coordinates of a rank index.")
      .def("__eq__", [](const ProcessMesh& a, nb::handle b) {
        return nb::isinstance<ProcessMesh>(b) && a == nb::cast<const ProcessMesh&>(b);
      })
      .def("__len__", &ProcessMesh::size)
      .def("__repr__", [](const ProcessMesh& mm) { return fmt::format("Mesh('{}')", mm.to_string()); })
      .def("__str__", &ProcessMesh::to_string);
  nb::implicitly_convertible<nb::dict, ProcessMesh>();
  nb::implicitly_convertible<nb::str, ProcessMesh>();
}

// The block the process `rank` holds of a tensor of `shape` under `placements` on the mesh.
mesh::LocalBlock block_of(nb::handle shape, nb::handle mesh_spec, nb::handle placements, int64_t rank) {
  ProcessMesh mm = mesh_of(mesh_spec);
  Shape global = shape_of(shape, "shape");
  DistAttr d = dist_of(placements, mm.ndim(), "placements");
  d.validate(global.ndim(), mm.ndim(), fmt::format("a tensor of shape {}", global.to_string()));
  return mesh::local_block(global, d, mm, mm.coords(mm.rank_index_of_process(rank)));
}

}  // namespace

nb::tuple shape_tuple(const Shape& shape) {
  nb::list out;
  for (int64_t d : shape) out.append(d);
  return nb::tuple(out);
}

mesh::ProcessMesh mesh_of(nb::handle spec) { return make_mesh(spec, nb::none()); }

mesh::DistAttr dist_of(nb::handle spec, int mesh_ndim, std::string_view what) {
  if (nb::isinstance<DistAttr>(spec)) {
    const auto& d = nb::cast<const DistAttr&>(spec);
    SW_CHECK(mesh_ndim < 0 || d.mesh_ndim() == mesh_ndim, "{}: {} placements for a mesh of {} dims", what,
             d.mesh_ndim(), mesh_ndim);
    return d;
  }
  if (nb::isinstance<nb::str>(spec)) return mesh::parse_dist(nb::cast<std::string>(spec), mesh_ndim);
  std::vector<Placement> items;
  for (nb::handle item : spec) {
    SW_CHECK(nb::isinstance<Placement>(item), "{}: {} is not a placement (Replicate(), Shard(d), Partial(op))", what,
             nb::cast<std::string>(nb::repr(item)));
    items.push_back(nb::cast<Placement>(item));
  }
  SW_CHECK(mesh_ndim < 0 || static_cast<int>(items.size()) == mesh_ndim, "{}: {} placements for a mesh of {} dims", what,
           items.size(), mesh_ndim);
  SW_CHECK(items.size() <= static_cast<size_t>(mesh::kMaxMeshDims), "{}: {} placements; meshes have at most {} dims",
           what, items.size(), mesh::kMaxMeshDims);
  return DistAttr(std::span<const Placement>(items));
}

Shape shape_of(nb::handle spec, std::string_view what) {
  if (nb::isinstance<nb::str>(spec)) return parse_shape(nb::cast<std::string>(spec));
  std::vector<int64_t> dims = nb::cast<std::vector<int64_t>>(spec);
  SW_CHECK(dims.size() <= static_cast<size_t>(kMaxDims), "{}: {} dims; at most {}", what, dims.size(), kMaxDims);
  for (int64_t d : dims) SW_CHECK(d >= 0, "{}: extent {} is negative", what, d);
  return Shape{std::span<const int64_t>(dims)};
}

Attrs attrs_of(nb::handle dict) {
  Attrs attrs;
  if (dict.is_none()) return attrs;
  for (auto [k, v] : nb::cast<nb::dict>(dict)) {
    std::string name = nb::cast<std::string>(k);
    if (nb::isinstance<nb::bool_>(v)) attrs.set(name, nb::cast<bool>(v));
    else if (nb::isinstance<nb::int_>(v)) attrs.set(name, nb::cast<int64_t>(v));
    else if (nb::isinstance<nb::float_>(v)) attrs.set(name, nb::cast<double>(v));
    else if (nb::isinstance<nb::str>(v)) attrs.set(name, nb::cast<std::string>(v));
    else if (nb::isinstance<nb::list>(v) || nb::isinstance<nb::tuple>(v)) attrs.set(name, nb::cast<std::vector<int64_t>>(v));
    else fail("attribute '{}': {} is not an int, float, bool, str or list of ints", name, nb::cast<std::string>(nb::repr(v)));
  }
  return attrs;
}

void bind_layouts(nb::module_& m) {
  bind_placement(m);
  bind_dist(m);
  bind_mesh(m);
  m.def("local_shape", [](nb::handle shape, nb::handle mesh_spec, nb::handle placements, int64_t rank) {
    return raising(ErrorKind::Usage, [&] { return shape_tuple(block_of(shape, mesh_spec, placements, rank).shape); });
  }, nb::arg("shape"), nb::arg("mesh"), nb::arg("placements"), nb::arg("rank"),
        "The shape of the block the process `rank` holds of a tensor of `shape` under `placements` on `mesh`.");
  m.def("local_block", [](nb::handle shape, nb::handle mesh_spec, nb::handle placements, int64_t rank) {
    return raising(ErrorKind::Usage, [&] {
      mesh::LocalBlock b = block_of(shape, mesh_spec, placements, rank);
      nb::list slices;
      for (int i = 0; i < b.shape.ndim(); ++i) {
        int64_t begin = b.offset[static_cast<size_t>(i)];
        slices.append(nb::slice(nb::int_(begin), nb::int_(begin + b.shape[i]), nb::none()));
      }
      return nb::make_tuple(shape_tuple(b.shape), shape_tuple(Shape{b.offsets()}), nb::tuple(slices));
    });
  }, nb::arg("shape"), nb::arg("mesh"), nb::arg("placements"), nb::arg("rank"),
        "(local shape, global offsets, slices) of the block the process `rank` holds: "
        "global_array[slices] is that rank's shard.");
}

}  // namespace shardwise::py
