#include "shardwise/cli/ckpt_cmd.h"

#include <cctype>
#include <filesystem>

#include "shardwise/ckpt/manifest.h"
#include "shardwise/ckpt/tools.h"
#include "shardwise/core/error.h"
#include "shardwise/core/plural.h"
#include "shardwise/models/model_io.h"

namespace shardwise::cli {

uint64_t parse_byte_size(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  std::string unit = text.substr(i);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double value = 0;
  try {
    value = i ? std::stod(text.substr(0, i)) : -1;
  } catch (const std::exception&) {
    value = -1;
  }
  const std::pair<const char*, double> units[] = {{"", 1},        {"B", 1},          {"KB", 1e3},        {"MB", 1e6},
                                                  {"GB", 1e9},    {"TB", 1e12},      {"KIB", 1024.0},    {"MIB", 1048576.0},
                                                  {"GIB", 1073741824.0}};
  for (const auto& [name, factor] : units) {
    if (unit == name && value > 0) return static_cast<uint64_t>(value * factor);
  }
  fail("size '{}': expected a positive number with an optional unit (B, KB, MB, GB, TB, KiB, MiB, GiB), e.g. 5GB", text);
}

namespace {

// A shardwise LoRA checkpoint records its base model's fingerprint (trainer_state.json, which
// --resume checks): lora-merge refuses another base unless told to skip the check. PEFT's adapters
// record none.
void check_adapter_base(const std::filesystem::path& base, const std::filesystem::path& adapter) {
  if (!std::filesystem::is_regular_file(adapter / "trainer_state.json")) return;
  const nlohmann::json lora = ckpt::load_json(adapter, "trainer_state.json").value("lora", nlohmann::json::object());
  const std::string recorded = lora.value("base_fingerprint", "");
  if (recorded.empty()) return;
  const std::filesystem::path dir = std::filesystem::is_directory(base) ? base : base.parent_path();
  SW_CHECK(train::model_fingerprint(dir) == recorded,
           "lora-merge: adapter {} was trained on the base model '{}', and base {} is another model or holds other "
           "weights (the fingerprints of their weight files differ): merge into the adapter's base, or pass "
           "--skip-base-check to merge anyway", adapter.string(), lora.value("base", ""), base.string());
}

}  // namespace

std::unique_ptr<CkptCommands> add_ckpt_commands(CLI::App& app) {
  auto c = std::make_unique<CkptCommands>();
  c->ckpt = app.add_subcommand("ckpt", "Checkpoint tools: inspect, verify, merge, lora-merge, convert");
  c->ckpt->require_subcommand(1);
  c->inspect = c->ckpt->add_subcommand("inspect", "Tensors, shapes, dtypes, sizes and saving mesh of a checkpoint or file");
  c->inspect->add_option("path", c->path, "checkpoint directory or .safetensors file")->required();
  c->verify = c->ckpt->add_subcommand("verify", "Check manifest, checksums, indexes and every file's safetensors rules");
  c->verify->add_option("dir", c->path, "checkpoint directory")->required();
  c->verify->add_flag("--no-checksums", c->no_checksums, "check sizes and structure only");
  c->merge = c->ckpt->add_subcommand("merge", "One Hugging Face style checkpoint (model weights) from any checkpoint");
  c->merge->add_option("dir", c->path, "checkpoint directory")->required();
  c->merge->add_option("out", c->out, "new output directory")->required();
  c->convert = c->ckpt->add_subcommand("convert", "Like merge, converting floating tensors to --dtype");
  c->convert->add_option("dir", c->path, "checkpoint directory")->required();
  c->convert->add_option("out", c->out, "new output directory")->required();
  c->convert->add_option("--dtype", c->dtype,
                          "f32, f16, bf16, f64 (FP8 weights dequantised), or f8-e4m3: linear weights in FP8 with "
                          "a scale per 128x128 block, the rest as they are")->required();
  c->lora = c->ckpt->add_subcommand("lora-merge", "W + (alpha/rank) B A for every adapted weight, adapter keys removed");
  c->lora->add_option("base", c->path, "base checkpoint directory or .safetensors file")->required();
  c->lora->add_option("adapter", c->adapter, "adapter directory (adapter_model.safetensors) or file")->required();
  c->lora->add_option("out", c->out, "new output directory")->required();
  c->lora->add_option("--alpha", c->alpha, "LoRA alpha (0: lora_alpha from the adapter's adapter_config.json)");
  c->lora->add_option("--rank", c->rank, "LoRA rank r (0: r from the adapter's adapter_config.json)");
  c->lora->add_flag("--skip-base-check", c->skip_base_check,
                    "merge even into a base other than the one a shardwise adapter records (trainer_state.json)");
  for (CLI::App* sub : {c->merge, c->convert, c->lora}) {
    sub->add_option("--max-shard-size", c->max_shard, "largest shard file, e.g. 5GB (default), 500MB");
    sub->add_option("--remove-keys", c->remove_keys, "glob patterns of keys to leave out")->delimiter(',');
  }
  return c;
}

namespace {

// --remove-keys: each key left out with its bytes, the total, and the patterns that matched nothing.
void report_removed(const ckpt::RemovedKeys& r, std::ostream& os) {
  for (const std::string& p : r.unmatched) os << fmt::format("note: --remove-keys '{}' matches no tensor\n", p);
  if (r.names.empty()) return;
  for (const std::string& n : r.names) os << fmt::format("removed {}\n", n);
  os << fmt::format("removed {} ({} bytes)\n", counted(static_cast<int64_t>(r.names.size()), "tensor"), r.bytes);
}

}  // namespace

int CkptCommands::run(std::ostream& os) const {
  if (*inspect) {
    ckpt::inspect(path, os);
    return 0;
  }
  if (*verify) {
    const bool plain = std::filesystem::is_regular_file(path) ||
                       (std::filesystem::is_directory(path) && !std::filesystem::exists(std::filesystem::path(path) /
                                                                                       ckpt::kManifestName));
    ckpt::VerifyReport r = plain ? ckpt::verify_safetensors_files(path) : ckpt::verify_checkpoint(path, !no_checksums);
    for (const auto& p : r.problems) os << "bad: " << p << "\n";
    for (const auto& n : r.notes) os << "note: " << n << "\n";
    if (!r.ok()) {
      os << fmt::format("{}: {}\n", path, counted(static_cast<int64_t>(r.problems.size()), "problem"));
      return 1;
    }
    if (plain) os << fmt::format("{}: ok (format rules only, no checksums exist)\n", path);
    else os << fmt::format("{}: ok (step {}{})\n", path, r.step, no_checksums ? ", checksums not checked" : "");
    return 0;
  }
  ckpt::RewriteOptions rw;
  rw.max_shard_bytes = parse_byte_size(max_shard);
  rw.remove_keys = remove_keys;
  if (*convert && dtype == "f8-e4m3") {
    rw.fp8_e4m3 = true;
  } else if (*convert) {
    DType d = DType::Bool;
    try {
      d = parse_dtype(dtype);
    } catch (const Error&) {  // named below
    }
    SW_CHECK(is_floating(d), "ckpt convert --dtype '{}': expected f32, f16, bf16, f64 or f8-e4m3 (FP8 weights with "
             "block scales)", dtype);
    rw.dtype = d;
  }
  report_removed(ckpt::removed_keys(path, remove_keys), os);
  if (*merge || *convert) {
    size_t n = ckpt::merge_checkpoint(path, out, rw);
    os << fmt::format("wrote {} to {}\n", counted(static_cast<int64_t>(n), "tensor"), out);
    return 0;
  }
  if (!skip_base_check) check_adapter_base(path, adapter);
  ckpt::LoraOptions lo{alpha, rank, {}, rw};
  const std::filesystem::path base_dir = std::filesystem::is_directory(path) ? std::filesystem::path(path)
                                                                             : std::filesystem::path(path).parent_path();
  lo.fan_in_fan_out = train::linear_weights_in_out(base_dir);  // GPT-2's Conv1D even for a bare adapter
  size_t n = ckpt::lora_merge(path, adapter, out, lo);
  os << fmt::format("merged {} adapted weights into {}\n", n, out);
  return 0;
}

}  // namespace shardwise::cli
