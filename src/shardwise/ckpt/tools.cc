#include "shardwise/ckpt/tools.h"

#include <fcntl.h>
#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <regex>
#include <set>

#include "shardwise/ckpt/checkpoint.h"
#include "shardwise/ckpt/file_io.h"
#include "shardwise/ckpt/fp8.h"
#include "shardwise/ckpt/group_reader.h"
#include "shardwise/ckpt/key_map.h"
#include "shardwise/ckpt/manifest.h"
#include "shardwise/ckpt/safetensors_writer.h"
#include "shardwise/core/error.h"
#include "shardwise/core/plural.h"
#include "shardwise/core/table.h"

namespace shardwise::ckpt {

namespace {

std::string human(uint64_t bytes) {
  if (bytes >= (1ull << 30)) return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1ull << 30));
  if (bytes >= (1ull << 20)) return fmt::format("{:.2f} MiB", static_cast<double>(bytes) / (1ull << 20));
  if (bytes >= (1ull << 10)) return fmt::format("{:.1f} KiB", static_cast<double>(bytes) / (1ull << 10));
  return fmt::format("{} B", bytes);
}

// 1234567 -> "1,234,567".
std::string grouped(int64_t n) {
  const std::string digits = std::to_string(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) out += (i > 0 && (digits.size() - i) % 3 == 0 ? "," : "") + digits.substr(i, 1);
  return out;
}

std::string shape_text(const Shape& s) { return fmt::format("[{}]", fmt::join(s.span(), ", ")); }

// The tensor table of `ckpt inspect`: name, dtype, shape, size and file, aligned by the widest cell.
TextTable tensor_table() {
  using A = TextTable::Align;
  return TextTable({A::Left, A::Left, A::Left, A::Right, A::Left}, "  ");
}

void add_tensor(TextTable& table, const StTensorInfo& t, std::string_view file) {
  table.row({t.name, std::string(st_dtype_name(t.dtype)), shape_text(t.shape), human(t.nbytes()), std::string(file)});
}

// The groups of a directory: from the manifest, else every *.safetensors.index.json / *.safetensors.
std::vector<std::string> groups_in(const fs::path& dir) {
  std::vector<std::string> groups;
  if (fs::exists(dir / kManifestName)) {
    auto m = nlohmann::json::parse(read_text_file(dir / kManifestName));
    const nlohmann::json listed = m.value("groups", nlohmann::json::object());
    for (const auto& [g, index] : listed.items()) groups.push_back(g);
    return groups;
  }
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string n = e.path().filename().string();
    if (n.ends_with(".safetensors.index.json")) groups.push_back(n.substr(0, n.size() - 23));
    else if (n.ends_with(".safetensors") && !std::regex_match(n, std::regex(".*-[0-9]{5}-of-[0-9]{5}\\.safetensors")))
      groups.push_back(n.substr(0, n.size() - 12));
  }
  std::sort(groups.begin(), groups.end());
  return groups;
}

bool matches_any(const std::string& name, const std::vector<std::string>& patterns) {
  for (const auto& p : patterns) {
    if (::fnmatch(p.c_str(), name.c_str(), 0) == 0) return true;
  }
  return false;
}

// A tensor of the output: its spec and bytes (borrowed from a mapped source or owned).
struct OutTensor {
  StSpec spec;
  std::span<const std::byte> data;
  std::shared_ptr<std::vector<std::byte>> owned;
};

OutTensor converted(const StTensorInfo& info, std::span<const std::byte> bytes, std::optional<DType> dtype) {
  OutTensor t{{info.name, info.dtype, info.shape}, bytes, nullptr};
  auto from = to_tensor_dtype(info.dtype);
  if (!dtype || !from || !is_floating(*from) || *from == *dtype) return t;  // integers, bool, F8, I16 kept as they are
  Tensor src(*from, info.shape);
  if (!bytes.empty()) std::memcpy(src.raw(), bytes.data(), bytes.size());
  Tensor dst = src.to(*dtype);
  t.owned = std::make_shared<std::vector<std::byte>>(dst.raw(), dst.raw() + dst.nbytes());
  t.spec.dtype = to_st_dtype(*dtype);
  t.data = *t.owned;
  return t;
}

// Writes OUT as a Hugging Face checkpoint by the commit protocol.
// transformers' name of a floating dtype (config.json's torch_dtype).
std::string torch_dtype_name(DType d) {
  switch (d) {
    case DType::F64: return "float64";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
    default: return "float32";
  }
}

// config.json, generation_config.json and the tokenizer's files are copied from `json_from`; after a conversion
// (options.dtype) config.json's torch_dtype names the new dtype.
// The part of the source checkpoint's key map (manifest "key_maps" of group "model") whose stored
// tensors are among `tensors`: merge, convert and lora-merge keep the keys, so the table still
// says which named tensors each fused one holds.
nlohmann::json kept_key_map(const fs::path& from, const std::vector<OutTensor>& tensors) {
  nlohmann::json out = nlohmann::json::object();
  if (!fs::exists(from / kManifestName)) return out;
  nlohmann::json m = nlohmann::json::parse(read_text_file(from / kManifestName));
  if (!m.contains("key_maps") || !m["key_maps"].contains("model")) return out;
  std::set<std::string> kept;
  for (const OutTensor& t : tensors) kept.insert(t.spec.name);
  for (const auto& [name, p] : m["key_maps"]["model"].items()) {
    if (kept.count(p.value("key", ""))) out[name] = p;
    if (p.contains("slices") && std::all_of(p["slices"].begin(), p["slices"].end(),
                                            [&](const nlohmann::json& k) { return kept.count(k.get<std::string>()); }))
      out[name] = p;
  }
  return out;
}

void write_hf_checkpoint(const fs::path& out, std::vector<OutTensor>& tensors, const fs::path& json_from,
                         const RewriteOptions& options) {
  const uint64_t max_shard_bytes = options.max_shard_bytes;
  SW_CHECK(max_shard_bytes > 0, "--max-shard-size must be > 0");
  SW_CHECK(!fs::exists(out), "'{}' already exists: the tools never overwrite (choose a new directory)", out.string());
  fs::path tmp = out;
  tmp += ".tmp";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  const nlohmann::json keys = kept_key_map(json_from, tensors);
  std::vector<std::vector<size_t>> shards;
  uint64_t in_shard = 0, total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    uint64_t b = tensors[i].data.size();
    if (shards.empty() || (in_shard > 0 && in_shard + b > max_shard_bytes)) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += b;
    total += b;
  }
  if (shards.empty()) shards.emplace_back();
  nlohmann::json weight_map = nlohmann::json::object();
  std::map<std::string, FileDigest> digests;
  for (size_t k = 0; k < shards.size(); ++k) {
    std::string name = shard_file_name("model", k + 1, shards.size());
    std::vector<StEntry> entries;
    for (size_t i : shards[k]) {
      entries.push_back({tensors[i].spec, tensors[i].data});
      weight_map[tensors[i].spec.name] = name;
    }
    write_safetensors(tmp / name, entries, StMetadata{{"format", "pt"}});
    digests[name] = digest_file(tmp / name, false);
  }
  nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_file_atomic(tmp / index_file_name("model"), index.dump(2) + "\n");
  digests[index_file_name("model")] = digest_file(tmp / index_file_name("model"), false);
  // The model's settings, and the tokenizer stored beside them (kTokenizerFiles, train/run_options.h).
  std::vector<std::string> names = {"config.json", "generation_config.json"};
  names.insert(names.end(), std::begin(kTokenizerFiles), std::end(kTokenizerFiles));
  for (const std::string& name : names) {
    if (!fs::exists(json_from / name)) continue;
    std::string text = read_text_file(json_from / name);
    if (name == "config.json" && (options.dtype || options.fp8_e4m3)) {  // the file says what the tensors now hold
      nlohmann::json config = nlohmann::json::parse(text);
      if (options.dtype) {
        config["torch_dtype"] = torch_dtype_name(*options.dtype);
        config.erase("quantization_config");  // FP8 weights were dequantised
      } else {
        config["quantization_config"] = fp8_quantization_config(options.fp8_block);
      }
      text = config.dump(2) + "\n";
    }
    write_file_atomic(tmp / name, text);
    digests[name] = digest_file(tmp / name, false);
  }
  write_file_atomic(tmp / kManifestName,
                    make_manifest(0, digests, {{"model", index_file_name("model")}}, {{"written_by", "shardwise ckpt"}},
                                  keys.empty() ? nlohmann::json::object() : nlohmann::json{{"model", keys}})
                            .dump(2) + "\n");
  fsync_dir(tmp);
  rename_path(tmp, out);
  fsync_dir(out.parent_path().empty() ? fs::path(".") : out.parent_path());
}

}  // namespace

void inspect(const fs::path& path, std::ostream& out) {
  if (fs::is_regular_file(path)) {
    SafetensorsFile f(path);
    out << fmt::format("{}: safetensors, header {} bytes, data {}, {}\n", path.string(), f.header().header_size,
                       human(f.header().data_size()), counted(static_cast<int64_t>(f.tensors().size()), "tensor"));
    for (const auto& [k, v] : f.header().metadata) out << fmt::format("  metadata {} = {}\n", k, v);
    TextTable table = tensor_table();
    for (const auto& t : f.tensors()) add_tensor(table, t, "");
    out << table.str();
    return;
  }
  SW_CHECK(fs::is_directory(path), "'{}' is neither a directory nor a file", path.string());
  nlohmann::json key_maps = nlohmann::json::object();  // group -> the manifest's key map
  if (fs::exists(path / kManifestName)) {
    auto m = nlohmann::json::parse(read_text_file(path / kManifestName));
    if (m.contains("key_maps")) key_maps = m["key_maps"];
    out << fmt::format("{}: step {}, {}\n", path.string(), m.value("step", -1),
                       counted(static_cast<int64_t>(m["files"].size()), "file"));
    if (m.contains("saved_on")) out << "  saved on: " << m["saved_on"].dump() << "\n";
  } else {
    SW_CHECK(!groups_in(path).empty(), "'{}' holds no {} and no safetensors files: not a checkpoint (pass a checkpoint "
             "directory or a .safetensors file)", path.string(), kManifestName);
    out << fmt::format("{}: no manifest (not a shardwise checkpoint, or not completed)\n", path.string());
  }
  for (const std::string& g : groups_in(path)) {
    GroupReader reader(path, g);
    int64_t elements = 0;
    for (const std::string& name : reader.names()) elements += reader.info(name).shape.numel();
    // The model's weights count parameters; the other groups (moments, masters) the elements they keep.
    const bool weights = g == "model" || g == "adapter_model";
    out << fmt::format("group {}: {}, {} {}, {} in {}\n", g,
                       counted(static_cast<int64_t>(reader.names().size()), "tensor"), grouped(elements),
                       plural_noun(elements, weights ? "parameter" : "element"), human(reader.total_size()),
                       counted(static_cast<int64_t>(reader.file_names().size()), "file"));
    const KeyMap keys = key_maps.contains(g) ? KeyMap::from_json(key_maps[g]) : KeyMap();
    TextTable table = tensor_table();
    for (const std::string& name : reader.names()) {
      add_tensor(table, reader.info(name), reader.file_name_of(name));
      const std::vector<std::string> names = keys.names_of(name);
      const std::vector<const KeyPlacement*> parts = keys.parts_of(name);
      for (size_t i = 0; i < parts.size(); ++i) {  // a fused tensor: what each box holds; a slice: of what
        const KeyPlacement& p = *parts[i];
        if (p.is_slice()) {
          table.line(fmt::format("    = {}[{}] of {}", names[i], p.index, p.shape.to_string()));
          continue;
        }
        std::vector<std::string> box;
        for (int d = 0; d < p.shape.ndim(); ++d)
          box.push_back(fmt::format("{}:{}", p.offset[static_cast<size_t>(d)], p.offset[static_cast<size_t>(d)] + p.shape[d]));
        table.line(fmt::format("    [{}] = {}", fmt::join(box, ", "), names[i]));
      }
    }
    out << table.str();
  }
  for (const auto& e : fs::directory_iterator(path)) {
    std::string n = e.path().filename().string();
    if (n.ends_with(".json") && !n.ends_with(".index.json") && n != kManifestName) out << "json file: " << n << "\n";
  }
}

namespace {

OutTensor owned_tensor(const std::string& name, StDType dtype, const Shape& shape, const std::byte* data, size_t n) {
  OutTensor t{{name, dtype, shape}, {}, std::make_shared<std::vector<std::byte>>(data, data + n)};
  t.data = *t.owned;
  return t;
}

// A weight --dtype f8-e4m3 quantises: a 2-D floating nn.Linear weight of a Llama-family layer, as
// the published FP8 checkpoints quantise them (their embeddings, head, norms and routers stay).
bool quantisable(const StTensorInfo& info) {
  static const std::regex linear(R"(.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)\.weight$)");
  auto dtype = to_tensor_dtype(info.dtype);
  return info.shape.ndim() == 2 && dtype && is_floating(*dtype) && std::regex_match(info.name, linear);
}

// The tensors `name` becomes: converted to options.dtype (an FP8 weight dequantised first; its scale
// then goes), or with options.fp8_e4m3 a linear weight quantised with its scale beside it.
void rewrite_tensor(const GroupReader& reader, const std::string& name, const RewriteOptions& options, Fp8Block from,
                    std::vector<OutTensor>& out) {
  const SafetensorsFile& f = reader.file_of(name);
  const StTensorInfo& info = f.info(name);
  if (options.dtype && fp8_weight_of_scale(reader, name)) return;
  if (options.dtype && info.dtype == StDType::F8_E4M3) {
    const Tensor w = read_key_box(reader, name, reshard::Box{{}, info.shape}, from).to(*options.dtype);
    out.push_back(owned_tensor(name, to_st_dtype(w.dtype()), w.shape(), w.raw(), w.nbytes()));
    return;
  }
  if (!options.fp8_e4m3 || !quantisable(info)) {
    out.push_back(converted(info, f.data(info), options.fp8_e4m3 ? std::nullopt : options.dtype));
    return;
  }
  const Fp8Weight q = fp8_quantize(f.read(name).to(DType::F32), options.fp8_block);
  out.push_back(owned_tensor(name, StDType::F8_E4M3, info.shape, reinterpret_cast<const std::byte*>(q.codes.data()),
                             q.codes.size()));
  out.push_back(owned_tensor(fp8_scale_key(name), StDType::F32, q.scale_inv.shape(), q.scale_inv.raw(),
                             q.scale_inv.nbytes()));
}

}  // namespace

size_t merge_checkpoint(const fs::path& dir, const fs::path& out, const RewriteOptions& options) {
  GroupReader reader(dir, "model");
  const bool fp8_source = std::any_of(reader.names().begin(), reader.names().end(), [&](const std::string& n) {
    return reader.info(n).dtype == StDType::F8_E4M3;
  });
  const Fp8Block from = fp8_source ? fp8_block_of(dir) : Fp8Block{};
  RewriteOptions o = options;
  if (fp8_source && o.fp8_e4m3) o.fp8_block = from;  // its weights stay as they are: one block size
  std::vector<OutTensor> tensors;
  size_t quantised = 0;
  for (const std::string& name : reader.names()) {
    if (matches_any(name, o.remove_keys)) continue;
    const size_t before = tensors.size();
    rewrite_tensor(reader, name, o, from, tensors);
    quantised += tensors.size() > before && tensors[before].spec.dtype == StDType::F8_E4M3;
  }
  SW_CHECK(!o.fp8_e4m3 || quantised > 0,
           "ckpt convert --dtype f8-e4m3: '{}' has no linear weights to quantise (2-D *.q_proj, k_proj, v_proj, "
           "o_proj, gate_proj, up_proj or down_proj weights of a Llama-family model; GPT-2's Conv1D weights are not "
           "read as FP8 by transformers)", dir.string());
  write_hf_checkpoint(out, tensors, dir, o);
  return tensors.size();
}

namespace {

std::unique_ptr<GroupReader> open_model(const fs::path& path, std::string_view what) {
  if (fs::is_regular_file(path)) {
    std::string stem = path.filename().string();
    SW_CHECK(stem.ends_with(".safetensors"), "{} '{}' is not a .safetensors file", what, path.string());
    return std::make_unique<GroupReader>(path.parent_path(), stem.substr(0, stem.size() - 12));
  }
  if (GroupReader::exists(path, "model")) return std::make_unique<GroupReader>(path, "model");
  if (GroupReader::exists(path, "adapter_model")) return std::make_unique<GroupReader>(path, "adapter_model");
  fail("{} '{}' has no model.safetensors(.index.json) or adapter_model.safetensors", what, path.string());
}

}  // namespace

RemovedKeys removed_keys(const fs::path& path, const std::vector<std::string>& patterns) {
  RemovedKeys r;
  if (patterns.empty()) return r;
  auto reader = open_model(path, "checkpoint");
  std::set<std::string> used;
  for (const std::string& name : reader->names()) {
    for (const std::string& p : patterns) {
      if (::fnmatch(p.c_str(), name.c_str(), 0) == 0) used.insert(p);
    }
    if (!matches_any(name, patterns)) continue;
    r.names.push_back(name);
    r.bytes += reader->info(name).nbytes();
  }
  for (const std::string& p : patterns) {
    if (!used.count(p)) r.unmatched.push_back(p);
  }
  return r;
}

namespace {

// The merge settings: adapter_config.json (when the adapter is a directory holding one) and the
// options, which must agree with it.
struct LoraSettings {
  double scale = 0;
  int64_t rank = 0;
  bool fan_in_fan_out = false;
  std::vector<std::string> targets;  // module names; empty: any
  std::string target_regex;          // PEFT's string form: a regex matched against the module path
};

LoraSettings lora_settings(const fs::path& adapter, const LoraOptions& options) {
  LoraSettings s;
  double alpha = options.alpha;
  s.rank = options.rank;
  bool rslora = false;
  const fs::path config = fs::is_directory(adapter) ? adapter / "adapter_config.json" : fs::path();
  if (!config.empty() && fs::exists(config)) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_text_file(config));
    } catch (const std::exception& e) {
      fail("lora-merge: cannot read '{}': {}", config.string(), e.what());
    }
    const int64_t r = j.value("r", int64_t{0});
    const double a = j.value("lora_alpha", 0.0);
    SW_CHECK(r > 0 && a != 0, "lora-merge: '{}' needs r > 0 and a lora_alpha, got r {} and lora_alpha {}",
             config.string(), r, a);
    SW_CHECK(options.rank == 0 || options.rank == r, "lora-merge: --rank {} but '{}' says r = {}", options.rank,
             config.string(), r);
    SW_CHECK(options.alpha == 0 || options.alpha == a, "lora-merge: --alpha {} but '{}' says lora_alpha = {}",
             options.alpha, config.string(), a);
    SW_CHECK(!j.contains("target_parameters") || j["target_parameters"].is_null() || j["target_parameters"].empty(),
             "lora-merge: '{}' adapts the experts' fused parameters (target_parameters {}), which lora-merge does not "
             "merge (their B interleaves the experts: PEFT's lora.ParamWrapper); merge them with PEFT's "
             "merge_and_unload, or train --lora-from the adapter", config.string(), j["target_parameters"].dump());
    for (const char* key : {"rank_pattern", "alpha_pattern"}) {
      SW_CHECK(!j.contains(key) || j[key].is_null() || j[key].empty(),
               "lora-merge: '{}' sets {} (per-module ranks or alphas), which lora-merge does not support",
               config.string(), key);
    }
    s.rank = r, alpha = a;
    rslora = j.value("use_rslora", false);
    s.fan_in_fan_out = j.value("fan_in_fan_out", false);
    if (j.contains("target_modules") && j["target_modules"].is_array()) {
      s.targets = j["target_modules"].get<std::vector<std::string>>();
    } else if (j.contains("target_modules") && j["target_modules"].is_string()) {
      s.target_regex = j["target_modules"].get<std::string>();
    }
  }
  SW_CHECK(s.rank > 0 && alpha != 0,
           "lora-merge: pass --rank and --alpha, or an adapter directory with PEFT's adapter_config.json");
  if (options.fan_in_fan_out) s.fan_in_fan_out = *options.fan_in_fan_out;
  s.scale = alpha / (rslora ? std::sqrt(static_cast<double>(s.rank)) : static_cast<double>(s.rank));
  return s;
}

// Checks that the adapted module `path` (e.g. "transformer.h.0.attn.c_attn") is a target.
void check_target(const LoraSettings& s, const std::string& path, const std::string& key) {
  if (!s.target_regex.empty()) {
    SW_CHECK(std::regex_match(path, std::regex(s.target_regex)),
             "lora-merge: adapter key '{}' adapts '{}', which target_modules '{}' does not match", key, path,
             s.target_regex);
    return;
  }
  if (s.targets.empty()) return;
  // PEFT's rule: an entry matches a module path equal to it or ending in "." + it ("attn.c_proj").
  auto matches = [&](const std::string& t) {
    return path == t || (path.size() > t.size() && path.ends_with(t) && path[path.size() - t.size() - 1] == '.');
  };
  SW_CHECK(std::any_of(s.targets.begin(), s.targets.end(), matches),
           "lora-merge: adapter key '{}' adapts module '{}', which is not in target_modules [{}]", key, path,
           fmt::join(s.targets, ", "));
}

}  // namespace

size_t lora_merge(const fs::path& base, const fs::path& adapter, const fs::path& out, const LoraOptions& options) {
  SW_CHECK(options.rank >= 0, "--rank must be > 0, got {}", options.rank);
  const LoraSettings settings = lora_settings(adapter, options);
  auto b = open_model(base, "base");
  auto a = open_model(adapter, "adapter");
  const std::regex lora_a(R"(^(?:base_model\.model\.)?(.*)\.lora_A(?:\.[^.]+)?\.weight$)");
  const std::regex lora_any(R"(.*\.lora_(A|B|embedding_A|embedding_B|magnitude_vector)(\..*)?$)");
  std::map<std::string, std::pair<std::string, std::string>> pairs;  // base weight -> (A key, B key)
  for (const std::string& key : a->names()) {
    std::smatch m;
    if (!std::regex_match(key, m, lora_a)) continue;
    std::string b_key = std::regex_replace(key, std::regex(R"(\.lora_A)"), ".lora_B");
    SW_CHECK(a->contains(b_key), "adapter '{}': '{}' has no matching '{}'", adapter.string(), key, b_key);
    check_target(settings, m[1].str(), key);
    pairs[m[1].str() + ".weight"] = {key, b_key};
  }
  SW_CHECK(!pairs.empty(), "adapter '{}' holds no '*.lora_A.weight' keys", adapter.string());
  const double scale = settings.scale;
  std::vector<OutTensor> tensors;
  size_t merged = 0;
  for (const std::string& name : b->names()) {
    if (std::regex_match(name, lora_any) || matches_any(name, options.rewrite.remove_keys)) continue;
    const SafetensorsFile& f = b->file_of(name);
    const StTensorInfo& info = f.info(name);
    auto it = pairs.find(name);
    if (it == pairs.end()) {
      tensors.push_back(converted(info, f.data(info), options.rewrite.dtype));
      continue;
    }
    Tensor w = f.read(name).to(DType::F64);
    Tensor A = a->file_of(it->second.first).read(it->second.first).to(DType::F64);
    Tensor B = a->file_of(it->second.second).read(it->second.second).to(DType::F64);
    SW_CHECK(w.ndim() == 2 && A.ndim() == 2 && B.ndim() == 2, "lora-merge '{}': only 2-d (linear) weights are merged", name);
    // W is [out, in] (nn.Linear), or [in, out] with fan_in_fan_out (Conv1D): B A is [out, in].
    const bool fan_in_out = settings.fan_in_fan_out;
    const int64_t rows = w.shape()[0], cols = w.shape()[1], r = settings.rank;
    const int64_t out_dim = fan_in_out ? cols : rows, in_dim = fan_in_out ? rows : cols;
    SW_CHECK(A.shape() == (Shape{r, in_dim}) && B.shape() == (Shape{out_dim, r}),
             "lora-merge '{}': W {}{} needs lora_A [{}, {}] and lora_B [{}, {}] for rank {}, got {} and {}", name,
             shape_text(w.shape()), fan_in_out ? " (fan_in_fan_out: [in, out])" : "", r, in_dim, out_dim, r, r,
             shape_text(A.shape()), shape_text(B.shape()));
    double* W = w.data<double>();
    const double* pa = A.data<double>();
    const double* pb = B.data<double>();
    for (int64_t o = 0; o < out_dim; ++o) {
      for (int64_t i = 0; i < in_dim; ++i) {
        double acc = 0;
        for (int64_t k = 0; k < r; ++k) acc += pb[o * r + k] * pa[k * in_dim + i];
        W[fan_in_out ? i * cols + o : o * cols + i] += scale * acc;
      }
    }
    Tensor back = w.to(options.rewrite.dtype && is_floating(*to_tensor_dtype(info.dtype)) ? *options.rewrite.dtype
                                                                                           : *to_tensor_dtype(info.dtype));
    OutTensor t{{name, to_st_dtype(back.dtype()), back.shape()}, {}, std::make_shared<std::vector<std::byte>>(back.raw(), back.raw() + back.nbytes())};
    t.data = *t.owned;
    tensors.push_back(std::move(t));
    pairs.erase(it);
    ++merged;
  }
  if (!pairs.empty()) {
    fail("lora-merge: the base '{}' has no weight '{}' for adapter keys '{}'", base.string(), pairs.begin()->first,
         pairs.begin()->second.first);
  }
  write_hf_checkpoint(out, tensors, fs::is_directory(base) ? base : base.parent_path(), options.rewrite);
  return merged;
}

}  // namespace shardwise::ckpt
