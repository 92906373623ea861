#pragma once
// Meshes and placements from Python: shardwise.Mesh, Placement (Replicate(), Shard(d),
// Partial(op)), Placements (one per mesh dim), local_shape / local_block.
#include <nanobind/nanobind.h>

#include "shardwise/core/attrs.h"
#include "shardwise/core/shape.h"
#include "shardwise/mesh/dist_attr.h"
#include "shardwise/mesh/process_mesh.h"

namespace shardwise::py {

namespace nb = nanobind;

// A Mesh, a {"dp": 2, "tp": 2} dict, a [2, 2] list or a "dp=2,tp=2" string.
mesh::ProcessMesh mesh_of(nb::handle spec);
// Placements, a list of Placement (one per mesh dim) or a "S(0),R" string; `what` names the tensor.
mesh::DistAttr dist_of(nb::handle spec, int mesh_ndim, std::string_view what);
// A tuple/list of ints (or a "8x16" string).
Shape shape_of(nb::handle spec, std::string_view what);
// A dict of ints, floats, bools, strings and int lists.
Attrs attrs_of(nb::handle dict);
nb::tuple shape_tuple(const Shape& shape);

void bind_layouts(nb::module_& m);

}  // namespace shardwise::py
