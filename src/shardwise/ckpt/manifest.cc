#include "shardwise/ckpt/manifest.h"

#include <algorithm>
#include <set>

#include "shardwise/ckpt/group_reader.h"
#include "shardwise/core/error.h"
#include "shardwise/core/plural.h"

namespace shardwise::ckpt {

nlohmann::json make_manifest(int64_t step, const std::map<std::string, FileDigest>& files,
                             const std::map<std::string, std::string>& groups, const nlohmann::json& saved_on,
                             const nlohmann::json& key_maps) {
  nlohmann::json m;
  m["format"] = kManifestFormat;
  const bool parts = std::any_of(files.begin(), files.end(), [](const auto& f) { return !f.second.parts.empty(); });
  m["version"] = parts ? 2 : 1;
  m["step"] = step;
  m["saved_on"] = saved_on;
  m["groups"] = groups;
  if (!key_maps.empty()) m["key_maps"] = key_maps;
  nlohmann::json fj = nlohmann::json::object();
  for (const auto& [name, d] : files) {
    nlohmann::json e = {{"size", d.size}};
    if (d.parts.empty()) e["xxh64"] = d.xxh64;
    for (const PartDigest& p : d.parts) e["xxh64_parts"].push_back({p.offset, p.n, p.xxh64});
    if (!d.sha256.empty()) e["sha256"] = d.sha256;
    fj[name] = e;
  }
  m["files"] = fj;
  return m;
}

namespace {

void check_group(const fs::path& dir, const std::string& group, VerifyReport& r) {
  std::string index = index_file_name(group);
  try {
    GroupReader g(dir, group);
    uint64_t total = 0;
    bool all_read = true;
    for (const std::string& file : g.file_names()) {
      std::unique_ptr<SafetensorsFile> f;
      try {
        f = std::make_unique<SafetensorsFile>(dir / file);
      } catch (const Error& e) {
        r.problems.push_back(fmt::format("{}: {}", file, e.what()));
        all_read = false;
        continue;
      }
      for (const auto& t : f->tensors()) {
        total += t.nbytes();
        if (!g.contains(t.name) || g.file_name_of(t.name) != file) {
          r.problems.push_back(fmt::format("{}: tensor '{}' is not listed in {} under this file", file, t.name, index));
        }
      }
      for (const std::string& name : g.names()) {
        if (g.file_name_of(name) == file && !f->header().find(name)) {
          r.problems.push_back(fmt::format("{}: {} puts tensor '{}' in this file, which does not hold it", file, index, name));
        }
      }
    }
    if (all_read && fs::exists(dir / index) && g.total_size() != total) {
      r.problems.push_back(fmt::format("{}: total_size {} != {} bytes of tensors in its shards", index, g.total_size(), total));
    }
  } catch (const Error& e) {
    r.problems.push_back(fmt::format("{}: {}", index, e.what()));
  }
}

// The parts [[offset, bytes, xxh64], ...] of the manifest's entry for `name`: they tile the file
// and each is the xxh64 of its bytes.
void check_parts(const fs::path& path, const std::string& name, const nlohmann::json& parts, uint64_t size,
                 VerifyReport& r) {
  MappedFile f(path);
  f.will_need(0, f.size());
  uint64_t at = 0;
  for (const auto& p : parts) {
    if (!p.is_array() || p.size() != 3 || !p[0].is_number_unsigned() || !p[1].is_number_unsigned() || !p[2].is_string() ||
        p[0].get<uint64_t>() != at || p[1].get<uint64_t>() > size - at) {
      r.problems.push_back(fmt::format("{}: xxh64_parts entry {} does not continue at byte {}", name, p.dump(), at));
      return;
    }
    const uint64_t n = p[1].get<uint64_t>();
    const std::string got = xxh64_hex(f.bytes().subspan(at, n));
    if (got != p[2].get<std::string>()) {
      r.problems.push_back(fmt::format("{}: xxh64 of bytes [{}, {}) {} != manifest {}", name, at, at + n, got,
                                       p[2].get<std::string>()));
    }
    at += n;
  }
  if (at != size) r.problems.push_back(fmt::format("{}: xxh64_parts cover {} of its {} bytes", name, at, size));
}

}  // namespace

VerifyReport verify_checkpoint(const fs::path& dir, bool checksums) {
  VerifyReport r;
  fs::path mpath = dir / kManifestName;
  if (!fs::is_directory(dir)) {
    r.problems.push_back(fmt::format("{}: not a directory", dir.string()));
    return r;
  }
  if (!fs::exists(mpath)) {
    r.problems.push_back(fmt::format("{}: missing (the checkpoint was not completed)", kManifestName));
    return r;
  }
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(read_text_file(mpath));
    SW_CHECK(m.is_object() && m.value("format", "") == kManifestFormat, "not a {} manifest", kManifestFormat);
    SW_CHECK(m.contains("files") && m["files"].is_object(), "no \"files\" object");
    SW_CHECK(m.contains("step") && m["step"].is_number_integer(), "no integer \"step\"");
    r.step = m["step"].get<int64_t>();
    r.newer_version = m.value("version", 1) > kManifestVersion;
    SW_CHECK(!r.newer_version, "version {} is newer than this shardwise reads ({})", m.value("version", 1), kManifestVersion);
  } catch (const std::exception& e) {
    r.problems.push_back(fmt::format("{}: {}", kManifestName, e.what()));
    return r;
  }
  std::set<std::string> listed;
  for (const auto& [name, e] : m["files"].items()) {
    listed.insert(name);
    fs::path p = dir / name;
    if (name.find('/') != std::string::npos || !fs::is_regular_file(p)) {
      r.problems.push_back(fmt::format("{}: listed in the manifest but missing", name));
      continue;
    }
    uint64_t want = e.value("size", uint64_t{0});
    uint64_t size = fs::file_size(p);
    if (size != want) {
      r.problems.push_back(fmt::format("{}: {} bytes, the manifest says {}", name, size, want));
      continue;
    }
    if (!checksums) continue;
    if (e.contains("xxh64_parts")) {  // a file several ranks wrote: each one's stretches
      check_parts(p, name, e["xxh64_parts"], size, r);
      continue;
    }
    bool with_sha = e.contains("sha256");
    FileDigest d = digest_file(p, with_sha);
    if (d.xxh64 != e.value("xxh64", "")) {
      r.problems.push_back(fmt::format("{}: xxh64 {} != manifest {}", name, d.xxh64, e.value("xxh64", "")));
    } else if (with_sha && d.sha256 != e.value("sha256", "")) {
      r.problems.push_back(fmt::format("{}: sha256 {} != manifest {}", name, d.sha256, e.value("sha256", "")));
    }
  }
  std::set<std::string> in_groups;
  if (m.contains("groups") && m["groups"].is_object()) {
    for (const auto& [group, index] : m["groups"].items()) {
      check_group(dir, group, r);
      if (GroupReader::exists(dir, group)) {
        try {
          for (const auto& f : GroupReader(dir, group).file_names()) in_groups.insert(f);
        } catch (const Error&) {
        }
      }
    }
  }
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::string name = entry.path().filename().string();
    if (name == kManifestName) continue;
    if (!listed.count(name)) r.notes.push_back(fmt::format("{}: present but not listed in the manifest (ignored)", name));
    // Safetensors files outside every group still have to follow the format.
    if (entry.path().extension() == ".safetensors" && !in_groups.count(name) && entry.is_regular_file()) {
      try {
        SafetensorsFile f(entry.path());
      } catch (const Error& e) {
        r.problems.push_back(fmt::format("{}: {}", name, e.what()));
      }
    }
  }
  return r;
}

VerifyReport verify_safetensors_files(const fs::path& path) {
  VerifyReport r;
  if (fs::is_regular_file(path)) {
    try {
      SafetensorsFile f(path);
    } catch (const Error& e) {
      r.problems.push_back(fmt::format("{}: {}", path.filename().string(), e.what()));
    }
    r.notes.push_back("a single safetensors file: format rules checked, no checksums exist for it");
    return r;
  }
  if (!fs::is_directory(path)) {
    r.problems.push_back(fmt::format("{}: neither a file nor a directory", path.string()));
    return r;
  }
  std::set<std::string> in_groups, groups;
  std::vector<fs::path> loose;
  for (const auto& e : fs::directory_iterator(path)) {
    std::string n = e.path().filename().string();
    if (n.ends_with(".safetensors.index.json")) groups.insert(n.substr(0, n.size() - 23));
    else if (n.ends_with(".safetensors")) loose.push_back(e.path());
  }
  for (const auto& g : groups) {
    check_group(path, g, r);
    try {
      for (const auto& f : GroupReader(path, g).file_names()) in_groups.insert(f);
    } catch (const Error&) {
    }
  }
  for (const auto& p : loose) {
    if (in_groups.count(p.filename().string())) continue;
    try {
      SafetensorsFile f(p);
    } catch (const Error& e) {
      r.problems.push_back(fmt::format("{}: {}", p.filename().string(), e.what()));
    }
  }
  if (groups.empty() && loose.empty()) {
    r.problems.push_back(fmt::format("{}: no {} and no safetensors files: not a checkpoint", path.string(), kManifestName));
    return r;
  }
  r.notes.push_back(fmt::format("no {}: {} and {} checked against the format rules, no checksums exist",
                                kManifestName, counted(static_cast<int64_t>(groups.size()), "index", "indexes"),
                                counted(static_cast<int64_t>(loose.size()), "safetensors file")));
  return r;
}

}  // namespace shardwise::ckpt
