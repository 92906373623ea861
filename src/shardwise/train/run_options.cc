#include "shardwise/train/run_options.h"

#include "shardwise/ckpt/file_io.h"
#include "shardwise/core/error.h"
#include "shardwise/data/tokenizer.h"

namespace shardwise::train {

namespace {

// transformers' AutoTokenizer reads tokenizer_config.json's class; the ids are the tokenizer's
// own. Training places no bos and ends each document with eos: so does the configured tokenizer.
nlohmann::json tokenizer_config(const Tokenizer& t, int64_t seq) {
  nlohmann::json j = {{"tokenizer_class", "LlamaTokenizer"}, {"add_bos_token", false}, {"add_eos_token", false},
                      {"model_max_length", seq}, {"clean_up_tokenization_spaces", false}};
  auto name = [&](const char* key, int64_t id) {
    if (id >= 0) j[key] = t.piece(id);
  };
  name("bos_token", t.bos_id());
  name("eos_token", t.eos_id());
  name("unk_token", t.unk_id());
  name("pad_token", t.pad_id());
  return j;
}

}  // namespace

void add_run_files(const TrainConfig& c, const nlohmann::json& options, const std::string& model_dir,
                   ckpt::CheckpointContent& content) {
  if (options.is_object()) content.json_files.emplace_back(kRunOptionsFile, nlohmann::json{{"options", options}});
  if (c.data.tokenizer.empty()) {
    for (const char* name : ckpt::kTokenizerFiles) {
      const ckpt::fs::path file = ckpt::fs::path(model_dir) / name;
      if (!model_dir.empty() && ckpt::fs::is_regular_file(file))
        content.raw_files.emplace_back(name, ckpt::read_text_file(file));
    }
    return;
  }
  const Tokenizer t(c.data.tokenizer);
  content.raw_files.emplace_back(kTokenizerFile, ckpt::read_text_file(c.data.tokenizer));
  content.json_files.emplace_back("tokenizer_config.json", tokenizer_config(t, c.model.seq));
}

std::optional<nlohmann::json> read_run_options(const ckpt::fs::path& dir) {
  const ckpt::fs::path path = dir / kRunOptionsFile;
  if (!ckpt::fs::exists(path)) return std::nullopt;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ckpt::read_text_file(path));
  } catch (const nlohmann::json::exception& e) {
    fail("{} is not JSON: {}", path.string(), e.what());
  }
  SW_CHECK(j.is_object() && j.contains("options") && j["options"].is_object(),
           "{}: expected {{\"options\": {{\"<option>\": [\"value\", ...]}}}}", path.string());
  for (const auto& [name, values] : j["options"].items()) {
    bool strings = values.is_array();
    for (const nlohmann::json& v : values) strings = strings && v.is_string();
    SW_CHECK(strings, "{}: option '{}' holds {}, expected a list of strings", path.string(), name, values.dump());
  }
  return j["options"];
}

std::optional<std::string> stored_tokenizer(const ckpt::fs::path& dir) {
  const ckpt::fs::path path = dir / kTokenizerFile;
  if (!ckpt::fs::is_regular_file(path)) return std::nullopt;
  return path.string();
}

}  // namespace shardwise::train
