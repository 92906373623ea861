// shardwise.checkpoint.save / save_all_ranks: this rank's shards (any DLPack or buffer-protocol
// array, no copy) as DistTensors with global shapes derived from every rank's local shapes (or
// given), saved by ckpt::save_checkpoint (or an AsyncSaver) over the caller's group.
#include <fmt/format.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>

#include "arrays.h"
#include "checkpoint.h"
#include "errors.h"
#include "layouts.h"
#include "shardwise/ckpt/async_saver.h"
#include "shardwise/ckpt/checkpoint.h"
#include "shardwise/comm/local.h"
#include "shardwise/mesh/shard_math.h"

namespace shardwise::py {
namespace {

using mesh::DistAttr;
using mesh::ProcessMesh;

struct Item {
  std::string name;
  Tensor local;
  DistAttr dist;
  std::optional<Shape> shape;  // the global shape, when the caller gave it
};
struct Group {
  std::string name;
  std::vector<Item> items;
  ckpt::KeyMap keys;
  bool single_file = false;
};
// One rank's save, taken from Python objects (under the GIL) before the save runs without it.
struct Prepared {
  ProcessMesh mesh;
  std::vector<Group> groups;
  int64_t step = 0;
  std::vector<std::pair<std::string, nlohmann::json>> json_files;
  std::vector<std::pair<std::string, std::string>> raw_files;
};

nlohmann::json parse_json(const std::string& text, std::string_view what) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("{} is not valid JSON: {}", what, e.what());
  }
}

// groups: [(group name, [(name, array, placements, shape or None)], key map JSON or None, single_file)]
std::vector<Group> groups_of(nb::handle groups, const ProcessMesh& mm) {
  std::vector<Group> out;
  for (nb::handle g : groups) {
    auto t = nb::cast<nb::tuple>(g);
    Group group{nb::cast<std::string>(t[0]), {}, {}, nb::cast<bool>(t[3])};
    if (!t[2].is_none()) group.keys = ckpt::KeyMap::from_json(parse_json(nb::cast<std::string>(t[2]), "key_map"));
    for (nb::handle entry : t[1]) {
      auto e = nb::cast<nb::tuple>(entry);
      Item item{nb::cast<std::string>(e[0]), {}, {}, std::nullopt};
      std::string what = fmt::format("'{}'", item.name);
      item.local = tensor_from(nb::cast<AnyArray>(e[1]), what, "checkpoint.save");
      item.dist = dist_of(e[2], mm.ndim(), what);
      if (!e[3].is_none()) item.shape = shape_of(e[3], what + " shape");
      group.items.push_back(std::move(item));
    }
    out.push_back(std::move(group));
  }
  return out;
}

Prepared prepare(nb::handle mesh_spec, nb::handle groups, int64_t step, nb::handle json_files, nb::handle raw_files) {
  Prepared p;
  p.mesh = mesh_of(mesh_spec);
  p.groups = groups_of(groups, p.mesh);
  p.step = step;
  for (nb::handle f : json_files) {
    auto t = nb::cast<nb::tuple>(f);
    std::string name = nb::cast<std::string>(t[0]);
    p.json_files.emplace_back(name, parse_json(nb::cast<std::string>(t[1]), "file " + name));
  }
  for (nb::handle f : raw_files) {
    auto t = nb::cast<nb::tuple>(f);
    nb::bytes b = nb::cast<nb::bytes>(t[1]);
    p.raw_files.emplace_back(nb::cast<std::string>(t[0]), std::string(b.c_str(), b.size()));
  }
  return p;
}

Shape shape_from_row(const int64_t* row) { return Shape{std::span<const int64_t>(row + 1, static_cast<size_t>(row[0]))}; }

// The global shape whose blocks under `dist` are the ranks' local shapes (`rows` by rank: ndim,
// then the dims): along each sharded dim, the sum of the extents of the ranks that hold distinct
// blocks along it; then every rank's block of that shape must be its local shape (chunk
// semantics, as torch.chunk and DTensor cut uneven dims).
Shape global_from_locals(const Item& item, const ProcessMesh& mm, const std::vector<int64_t>& rows, size_t width) {
  auto row = [&](int64_t process) { return rows.data() + static_cast<size_t>(process) * width; };
  Shape first = shape_from_row(row(mm.process_ids()[0]));
  item.dist.validate(first.ndim(), mm.ndim(), fmt::format("'{}' (local shape {})", item.name, first.to_string()));
  Shape global = first;
  for (int d = 0; d < first.ndim(); ++d) {
    if (!item.dist.is_sharded(d)) continue;
    mesh::MeshDimList sharding = item.dist.mesh_dims_of(d);
    int64_t sum = 0;
    for (int64_t r = 0; r < mm.size(); ++r) {
      std::vector<int64_t> c = mm.coords(r);
      bool base = true;
      for (int md = 0; md < mm.ndim(); ++md) base = base && (sharding.contains(md) || c[static_cast<size_t>(md)] == 0);
      const int64_t* other = row(mm.process_ids()[static_cast<size_t>(r)]);
      if (base && other[0] == first.ndim()) sum += other[1 + d];
    }
    global[d] = sum;
  }
  for (int64_t r = 0; r < mm.size(); ++r) {
    int64_t process = mm.process_ids()[static_cast<size_t>(r)];
    Shape held = shape_from_row(row(process)), expected = mesh::local_shape(global, item.dist, mm, mm.coords(r));
    SW_CHECK(held == expected,
             "'{}': rank {} holds a shard of shape {}, but the ranks' shards add up to a global shape {} whose "
             "block on rank {} under {} is {} (uneven shards follow chunk semantics, as torch.chunk and DTensor cut "
             "them; otherwise pass the global shapes with shapes=)",
             item.name, process, held.to_string(), global.to_string(), process, item.dist.to_string(),
             expected.to_string());
  }
  return global;
}

// Collective: every rank's local shapes, then each tensor's global shape (given ones are kept).
void derive_shapes(comm::Communicator& comm, const ProcessMesh& mm, std::vector<Group>& groups) {
  for (int64_t process : mm.process_ids())
    SW_CHECK(process < comm.size(), "the mesh {} names process {}, but the group has {} ranks", mm.to_string(),
             process, comm.size());
  SW_CHECK(mm.contains(comm.rank()), "rank {} is not in the mesh {}", comm.rank(), mm.to_string());
  const size_t width = 1 + kMaxDims;
  std::vector<int64_t> mine;
  for (const Group& g : groups)
    for (const Item& item : g.items) {
      mine.push_back(item.local.shape().ndim());
      for (int d = 0; d < kMaxDims; ++d) mine.push_back(d < item.local.shape().ndim() ? item.local.shape()[d] : 0);
    }
  int64_t count = static_cast<int64_t>(mine.size() / width);
  std::vector<int64_t> counts(static_cast<size_t>(comm.size()));
  comm.all_gather(&count, counts.data(), 1, DType::I64);
  for (int r = 0; r < comm.size(); ++r)
    SW_CHECK(counts[static_cast<size_t>(r)] == count, "rank {} saves {} tensors but rank {} saves {}: every rank "
             "saves the same names", r, counts[static_cast<size_t>(r)], comm.rank(), count);
  std::vector<int64_t> rows(mine.size() * static_cast<size_t>(comm.size()));
  comm.all_gather(mine.data(), rows.data(), static_cast<int64_t>(mine.size()), DType::I64);
  size_t k = 0;
  for (Group& g : groups)
    for (Item& item : g.items) {
      std::vector<int64_t> one;
      for (int r = 0; r < comm.size(); ++r) {
        const int64_t* row = rows.data() + (static_cast<size_t>(r) * static_cast<size_t>(count) + k) * width;
        one.insert(one.end(), row, row + width);
      }
      if (!item.shape) item.shape = global_from_locals(item, mm, one, width);
      ++k;
    }
}

ckpt::CheckpointContent content_on(comm::Communicator& comm, Prepared& p) {
  derive_shapes(comm, p.mesh, p.groups);
  ckpt::CheckpointContent content;
  content.step = p.step;
  content.json_files = p.json_files;
  content.raw_files = p.raw_files;
  for (const Group& g : p.groups) {
    ckpt::TensorGroup group{g.name, {}, g.keys, g.single_file};
    for (const Item& item : g.items)
      group.tensors.push_back({item.name, *item.shape, item.local.dtype(), reshard::Layout{p.mesh, item.dist}, item.local});
    content.groups.push_back(std::move(group));
  }
  return content;
}

ckpt::SaveOptions options_of(uint64_t max_shard_bytes, bool sha256, int64_t save_total_limit) {
  ckpt::SaveOptions o;
  SW_CHECK(max_shard_bytes > 0, "max_shard_bytes must be positive");
  SW_CHECK(save_total_limit >= 0, "save_total_limit {} is negative", save_total_limit);
  o.max_shard_bytes = max_shard_bytes, o.sha256 = sha256, o.save_total_limit = save_total_limit;
  return o;
}

// An async save in flight: wait() gives its directory or raises its error.
struct SaveHandle {
  std::shared_ptr<comm::Communicator> comm;  // outlives the save
  std::unique_ptr<ckpt::AsyncSaver> saver;
  std::optional<std::string> dir;
  ~SaveHandle() {
    nb::gil_scoped_release release;  // the saver's worker may call a Python group
    saver.reset();
  }
  std::string wait() {
    if (!dir) {
      nb::gil_scoped_release release;
      std::optional<ckpt::fs::path> done = saver->finish();
      SW_CHECK(done.has_value(), "the async save wrote nothing");
      dir = done->string();
    }
    return *dir;
  }
};

nb::object save(const CheckpointGroup& group, const std::string& path, nb::handle mesh_spec, nb::handle groups,
                int64_t step, nb::handle json_files, nb::handle raw_files, const ckpt::SaveOptions& options,
                bool async_save) {
  Prepared p = prepare(mesh_spec, groups, step, json_files, raw_files);
  if (async_save) {
    auto handle = std::make_unique<SaveHandle>();
    handle->comm = group.comm;
    handle->saver = std::make_unique<ckpt::AsyncSaver>(options);
    {
      nb::gil_scoped_release release;
      ckpt::CheckpointContent content = content_on(*group.comm, p);
      handle->saver->save(*group.comm, path, content);
    }
    return nb::cast(std::move(handle));
  }
  ckpt::fs::path dir;
  {
    nb::gil_scoped_release release;
    ckpt::CheckpointContent content = content_on(*group.comm, p);
    dir = ckpt::save_checkpoint(*group.comm, path, content, options);
  }
  return nb::cast(dir.string());
}

std::string save_all_ranks(const std::string& path, nb::handle mesh_spec, nb::handle per_rank, int64_t step,
                           nb::handle json_files, nb::handle raw_files, const ckpt::SaveOptions& options) {
  std::vector<Prepared> ranks;
  for (nb::handle groups : per_rank) ranks.push_back(prepare(mesh_spec, groups, step, json_files, raw_files));
  SW_CHECK(!ranks.empty(), "save_all_ranks: no ranks' shards given");
  std::string dir;
  std::mutex mu;
  nb::gil_scoped_release release;
  comm::LocalWorld::run(static_cast<int>(ranks.size()), [&](comm::Communicator& comm) {
    ckpt::CheckpointContent content = content_on(comm, ranks[static_cast<size_t>(comm.rank())]);
    ckpt::fs::path saved = ckpt::save_checkpoint(comm, path, content, options);
    std::lock_guard lock(mu);
    dir = saved.string();
  });
  return dir;
}

}  // namespace

void bind_checkpoint_save(nb::module_& m) {
  nb::class_<SaveHandle>(m, "AsyncSave", "An async checkpoint save in flight (shardwise.checkpoint.save(async_save=True)).")
      .def("wait", [](SaveHandle& h) { return raising(ErrorKind::Checkpoint, [&] { return h.wait(); }); },
           "Waits for the save; returns the checkpoint's directory or raises the save's error.");
  m.def("_save", [](const CheckpointGroup& group, const std::string& path, nb::handle mesh, nb::handle groups,
                    int64_t step, nb::handle json_files, nb::handle raw_files, uint64_t max_shard_bytes, bool sha256,
                    int64_t save_total_limit, bool async_save) {
    return raising(ErrorKind::Checkpoint, [&] {
      return save(group, path, mesh, groups, step, json_files, raw_files,
                  options_of(max_shard_bytes, sha256, save_total_limit), async_save);
    });
  }, "Collective over `group`: saves this rank's shards (see shardwise.checkpoint.save).");
  m.def("_save_all_ranks", [](const std::string& path, nb::handle mesh, nb::handle per_rank, int64_t step,
                              nb::handle json_files, nb::handle raw_files, uint64_t max_shard_bytes, bool sha256,
                              int64_t save_total_limit) {
    return raising(ErrorKind::Checkpoint, [&] {
      return save_all_ranks(path, mesh, per_rank, step, json_files, raw_files,
                            options_of(max_shard_bytes, sha256, save_total_limit));
    });
  }, "Saves every rank's shards, one thread per rank (see shardwise.checkpoint.save_all_ranks).");
}

}  // namespace shardwise::py
