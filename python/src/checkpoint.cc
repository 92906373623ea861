// shardwise.checkpoint.load / info: a checkpoint's groups and tensors (names as the program knows
// them: through the manifest's key map, "<param>/exp_avg" in the optimizer group) and this rank's
// blocks of them on any mesh and layout, read by ckpt::load_group (only this rank's bytes).
#include <fmt/format.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "arrays.h"
#include "checkpoint.h"
#include "errors.h"
#include "layouts.h"
#include "shardwise/ckpt/checkpoint.h"
#include "shardwise/ckpt/commit.h"
#include "shardwise/ckpt/group_reader.h"
#include "shardwise/ckpt/manifest.h"
#include "shardwise/ckpt/st_dtype.h"

namespace shardwise::py {
namespace {

bool holds_tensors(const ckpt::fs::path& dir) {
  if (ckpt::fs::exists(dir / ckpt::kManifestName)) return true;
  for (const auto& e : ckpt::fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") return true;
  return false;
}

// `path` itself when it holds a checkpoint, else the newest complete checkpoint under it.
ckpt::fs::path checkpoint_dir(const std::string& path) {
  ckpt::fs::path p(path);
  SW_CHECK(ckpt::fs::exists(p), "no checkpoint at '{}': it does not exist", path);
  SW_CHECK(ckpt::fs::is_directory(p), "'{}' is a file, not a checkpoint directory", path);
  if (holds_tensors(p)) return p;
  // Complete checkpoints only (a save in progress is a ".tmp" directory until its rename); nothing
  // is removed or set aside, unlike a resume: another job may be saving here.
  std::vector<ckpt::CheckpointEntry> saved = ckpt::list_checkpoints(p);
  SW_CHECK(!saved.empty(), "'{}' holds no checkpoint (no manifest.json, no .safetensors file, no complete "
           "checkpoint-<step>/ directory)", path);
  return saved.back().dir;
}

nlohmann::json manifest_of(const ckpt::fs::path& dir) {
  std::ifstream in(dir / ckpt::kManifestName);
  if (!in) return nlohmann::json::object();
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON: {}", (dir / ckpt::kManifestName).string(), e.what());
  }
}

// The groups of `dir`: the manifest's, else every "<g>.safetensors.index.json" and "<g>.safetensors".
std::vector<std::string> group_names(const ckpt::fs::path& dir, const nlohmann::json& manifest) {
  std::vector<std::string> out;
  if (manifest.contains("groups") && manifest["groups"].is_object()) {
    for (const auto& [g, index] : manifest["groups"].items()) out.push_back(g);
    return out;
  }
  static const std::regex shard(R"(.*-\d{5}-of-\d{5}\.safetensors)"), index(R"((.*)\.safetensors\.index\.json)"),
      single(R"((.*)\.safetensors)");
  for (const auto& e : ckpt::fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    std::smatch m;
    if (std::regex_match(name, shard)) continue;
    if (std::regex_match(name, m, index) || std::regex_match(name, m, single)) out.push_back(m[1]);
  }
  std::sort(out.begin(), out.end());
  return out;
}

ckpt::KeyMap key_map_of(const nlohmann::json& manifest, const std::string& group, const std::optional<std::string>& given) {
  if (given) return ckpt::KeyMap::from_json(nlohmann::json::parse(*given));
  if (manifest.contains("key_maps") && manifest["key_maps"].contains(group))
    return ckpt::KeyMap::from_json(manifest["key_maps"][group]);
  return {};
}

std::string dtype_text(ckpt::StDType t) {
  std::optional<DType> d = ckpt::to_tensor_dtype(t);
  return d ? std::string(dtype_name(*d)) : std::string(ckpt::st_dtype_name(t));
}

// name -> (shape, dtype) of the group's tensors as the program names them.
nb::dict group_tensors(const ckpt::fs::path& dir, const std::string& group, const ckpt::KeyMap& keys) {
  SW_CHECK(ckpt::GroupReader::exists(dir, group), "'{}' has no tensor group '{}'", dir.string(), group);
  ckpt::GroupReader reader(dir, group);
  nb::dict out;
  for (const auto& [name, placements] : keys.entries()) {
    const std::string& key = placements.front().key;
    SW_CHECK(reader.contains(key), "'{}': group '{}' has no tensor '{}' (where the key map stores '{}')",
             dir.string(), group, key, name);
    out[name.c_str()] = nb::make_tuple(shape_tuple(placements.front().shape), dtype_text(reader.info(key).dtype));
  }
  for (const std::string& key : reader.names()) {
    if (!keys.names_of(key).empty()) continue;
    const ckpt::StTensorInfo& info = reader.info(key);
    out[key.c_str()] = nb::make_tuple(shape_tuple(info.shape), dtype_text(info.dtype));
  }
  return out;
}

nb::dict info(const std::string& path, const std::optional<std::string>& key_map) {
  ckpt::fs::path dir = checkpoint_dir(path);
  nlohmann::json manifest = manifest_of(dir);
  nb::dict groups;
  for (const std::string& g : group_names(dir, manifest))
    groups[g.c_str()] = group_tensors(dir, g, key_map_of(manifest, g, g == "model" ? key_map : std::nullopt));
  nb::dict out;
  out["dir"] = dir.string();
  out["step"] = manifest.contains("step") ? manifest["step"].get<int64_t>()
                                          : ckpt::parse_checkpoint_dir(dir.filename().string()).value_or(0);
  out["groups"] = groups;
  return out;
}

// The group's stored keys that no asked tensor reads: they may stay in the files (a missing one
// is still an Error).
std::vector<std::string> unasked_keys(const ckpt::fs::path& dir, const std::string& group,
                                      const std::vector<ckpt::LoadSpec>& wanted, const ckpt::KeyMap& keys) {
  if (!ckpt::GroupReader::exists(dir, group)) return {};
  std::set<std::string> used;
  for (const ckpt::LoadSpec& s : wanted) {
    used.insert(s.name);
    for (const ckpt::KeyPlacement& p : keys.placements(s.name)) used.insert(p.key);
  }
  std::vector<std::string> out;
  ckpt::GroupReader reader(dir, group);
  for (const std::string& key : reader.names())
    if (!used.count(key)) out.push_back(key);
  return out;
}

// specs: [(name, global shape, placements, dtype)]
nb::dict load(const std::string& path, const std::string& group, nb::handle mesh_spec, nb::handle specs, int64_t rank,
              const std::optional<std::string>& key_map, bool convert_dtype) {
  ckpt::fs::path dir = checkpoint_dir(path);
  mesh::ProcessMesh mm = mesh_of(mesh_spec);
  SW_CHECK(mm.contains(rank), "rank {} is not in the mesh {}", rank, mm.to_string());
  std::vector<ckpt::LoadSpec> wanted;
  for (nb::handle s : specs) {
    auto t = nb::cast<nb::tuple>(s);
    std::string name = nb::cast<std::string>(t[0]), what = fmt::format("'{}'", name);
    Shape shape = shape_of(t[1], what);
    mesh::DistAttr dist = dist_of(t[2], mm.ndim(), what);
    dist.validate(shape.ndim(), mm.ndim(), fmt::format("{} of shape {}", what, shape.to_string()));
    wanted.push_back({name, shape, parse_dtype(nb::cast<std::string>(t[3])), reshard::Layout{mm, dist}});
  }
  ckpt::LoadOptions options;
  options.keys = key_map_of(manifest_of(dir), group, key_map);
  options.convert_dtype = convert_dtype;
  options.ignore_keys = unasked_keys(dir, group, wanted, options.keys);
  std::map<std::string, Tensor> got;
  {
    nb::gil_scoped_release release;
    got = ckpt::load_group(dir, group, wanted, rank, options);
  }
  nb::dict out;
  for (const ckpt::LoadSpec& s : wanted) {
    const Tensor& t = got.at(s.name);
    out[s.name.c_str()] = t.defined() ? array_from(t) : nb::none();
  }
  return out;
}

}  // namespace

void bind_checkpoint_load(nb::module_& m) {
  m.def("_ckpt_info", [](const std::string& path, const std::optional<std::string>& key_map) {
    return raising(ErrorKind::Checkpoint, [&] { return info(path, key_map); });
  }, nb::arg("path"), nb::arg("key_map") = nb::none(),
        "{'dir', 'step', 'groups': {group: {name: (shape, dtype)}}} of a checkpoint (see shardwise.checkpoint.info).");
  m.def("_ckpt_load", [](const std::string& path, const std::string& group, nb::handle mesh, nb::handle specs,
                         int64_t rank, const std::optional<std::string>& key_map, bool convert_dtype) {
    return raising(ErrorKind::Checkpoint, [&] { return load(path, group, mesh, specs, rank, key_map, convert_dtype); });
  }, "This rank's blocks of the asked tensors (see shardwise.checkpoint.load).");
}

}  // namespace shardwise::py
