#pragma once
// manifest.json: the last file of a checkpoint, listing every other file with its size and
// checksums, the step, the groups and the topology it was saved on. Its presence in a directory
// without the ".tmp" suffix is what makes a checkpoint complete; verify_checkpoint re-checks it.
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "shardwise/ckpt/checksum.h"

namespace shardwise::ckpt {

inline constexpr const char* kManifestName = "manifest.json";
inline constexpr const char* kManifestFormat = "shardwise-checkpoint";
// 1: every file has one xxh64; 2: some have xxh64_parts instead (files several ranks wrote). A
// manifest is written at the lowest version that holds it; a newer one is refused by name.
inline constexpr int kManifestVersion = 2;

// groups: group name -> its index file name; key_maps: group name -> its KeyMap's JSON (key_map.h),
// for the groups that place tensors in fused stored tensors.
nlohmann::json make_manifest(int64_t step, const std::map<std::string, FileDigest>& files,
                             const std::map<std::string, std::string>& groups, const nlohmann::json& saved_on,
                             const nlohmann::json& key_maps = nlohmann::json::object());

struct VerifyReport {
  int64_t step = -1;
  std::vector<std::string> problems;  // each names the file at fault
  std::vector<std::string> notes;     // harmless findings (files the manifest does not list)
  bool newer_version = false;         // the manifest's version is above kManifestVersion (nothing else checked)
  bool ok() const { return problems.empty(); }
};

// Checks the manifest (every file present, sizes, and the checksums when `checksums`), notes each
// file it does not list (not a problem: nothing of the checkpoint reads it), every safetensors file against the format rules, and every index against its
// shards (each tensor where the index says, no tensor left out, total_size).
VerifyReport verify_checkpoint(const fs::path& dir, bool checksums = true);

// What can be checked without a manifest: a single .safetensors file, or a plain directory (a
// Hugging Face one) whose every safetensors file and index is checked against the format rules.
// A note says that no checksums exist; a directory without safetensors files is a problem.
VerifyReport verify_safetensors_files(const fs::path& path);

}  // namespace shardwise::ckpt
