// `shardwise generate`: continues prompts with a saved GPT-2 or Llama model on the ranks of a dp x
// tp mesh (threads by default, MPI processes under mpirun), with a KV cache or by recomputing the prefix.
// Byte-vocabulary models (vocab <= 256) take and print text; others take and print token ids.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "shardwise/ckpt/safetensors_writer.h"
#include "shardwise/cli/commands.h"
#include "shardwise/cli/device_option.h"
#include "shardwise/cli/gemm_cmd.h"
#include "shardwise/cli/train/run_header.h"
#include "shardwise/comm/local.h"
#include "shardwise/comm/mpi.h"
#include "shardwise/core/error.h"
#include "shardwise/tensor/gemm.h"
#include "shardwise/tensor/parallel.h"
#include "shardwise/generate/generate.h"
#include "shardwise/models/model_io.h"
#include "shardwise/data/tokenizer.h"
#include "shardwise/train/run_options.h"
#include "shardwise/core/plural.h"

namespace shardwise::cli {
namespace {

constexpr int64_t kByteVocab = 256;

std::vector<int64_t> bytes_of(const std::string& text) {
  std::vector<int64_t> ids;
  for (char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

std::string text_of(std::span<const int64_t> ids) {
  std::string s;
  for (int64_t t : ids) s.push_back(static_cast<char>(t));
  return s;
}

// Text in and out: a SentencePiece model (--tokenizer), else bytes for a byte vocabulary, else none
// (ids only).
struct TextCodec {
  std::optional<train::Tokenizer> tokenizer;
  bool bytes = false;
  bool has_text() const { return tokenizer.has_value() || bytes; }
  std::vector<int64_t> encode(const std::string& text) const { return tokenizer ? tokenizer->encode(text) : bytes_of(text); }
  std::string decode(std::span<const int64_t> ids) const { return tokenizer ? tokenizer->decode(ids) : text_of(ids); }
};

TextCodec codec_for(const GenerateOptions& o, const train::GptConfig& model) {
  TextCodec c;
  if (o.tokenizer.empty()) {
    c.bytes = model.vocab <= kByteVocab;
    return c;
  }
  c.tokenizer.emplace(o.tokenizer);
  SW_CHECK(c.tokenizer->vocab_size() <= model.vocab,
           "--tokenizer {} has a vocabulary of {} ids; the model's holds {}: it was not trained with this tokenizer",
           o.tokenizer, c.tokenizer->vocab_size(), model.vocab);
  return c;
}

// "1,2,3;4,5" -> {{1,2,3},{4,5}}.
std::vector<std::vector<int64_t>> parse_prompt_ids(const std::string& spec) {
  std::vector<std::vector<int64_t>> out;
  std::stringstream prompts(spec);
  std::string prompt;
  while (std::getline(prompts, prompt, ';')) {
    std::vector<int64_t> ids;
    std::stringstream items(prompt);
    std::string item;
    while (std::getline(items, item, ',')) {
      size_t used = 0;
      int64_t id = -1;
      try {
        id = std::stoll(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      SW_CHECK(used > 0 && item.find_first_not_of(" ", used) == std::string::npos,
               "--prompt-ids: '{}' in prompt {} is not a token id (ids separated by ',', prompts by ';')", item,
               out.size());
      ids.push_back(id);
    }
    out.push_back(std::move(ids));
  }
  SW_CHECK(!out.empty(), "--prompt-ids is empty: give ids like 1,2,3 (several prompts separated by ';')");
  return out;
}

// --prompt, the lines of --prompt-file (empty lines skipped), then --prompt-ids, in that order.
std::vector<std::vector<int64_t>> collect_prompts(const GenerateOptions& o, const train::GptConfig& model,
                                                  const TextCodec& codec) {
  std::vector<std::string> texts = o.prompts;
  if (!o.prompt_file.empty()) {
    SW_CHECK(!std::filesystem::is_directory(o.prompt_file), "--prompt-file '{}' is a directory", o.prompt_file);
    std::ifstream in(o.prompt_file);
    SW_CHECK(in.good(), "cannot read --prompt-file '{}'", o.prompt_file);
    size_t before = texts.size();
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) texts.push_back(line);
    SW_CHECK(texts.size() > before, "--prompt-file '{}' holds no prompt (one per non-empty line)", o.prompt_file);
  }
  SW_CHECK(texts.empty() || codec.has_text(),
           "--prompt and --prompt-file give text, which needs a byte vocabulary (at most {} tokens) or --tokenizer; "
           "this model's vocabulary has {}: give token ids with --prompt-ids, or the model's --tokenizer",
           kByteVocab, model.vocab);
  std::vector<std::vector<int64_t>> prompts;
  for (const auto& t : texts) prompts.push_back(codec.encode(t));
  if (!o.prompt_ids.empty())
    for (auto& p : parse_prompt_ids(o.prompt_ids)) prompts.push_back(std::move(p));
  SW_CHECK(!prompts.empty(), "no prompt: give --prompt TEXT, --prompt-file FILE or --prompt-ids 1,2,3");
  return prompts;
}

// --eos-id, else generation_config.json's eos_token_id (an id, or a list of ids: each ends a
// sequence; config.json's when there is no generation_config.json), else the tokenizer's eos, else
// none (-1): the order of transformers' generate, which reads the generation config and never the
// tokenizer. The first id, then the others.
std::vector<int64_t> resolve_eos(const GenerateOptions& o, const std::filesystem::path& dir, const TextCodec& codec) {
  if (o.eos_id != kEosFromModel) return {o.eos_id};
  const std::filesystem::path file = dir / (std::filesystem::exists(dir / "generation_config.json")
                                                ? "generation_config.json" : "config.json");
  const nlohmann::json j = std::filesystem::exists(file)
                               ? ckpt::load_json(dir, file.filename().string()).value("eos_token_id", nlohmann::json())
                               : nlohmann::json();
  std::vector<int64_t> ids;
  if (j.is_number_integer()) ids.push_back(j.get<int64_t>());
  for (const nlohmann::json& id : j.is_array() ? j : nlohmann::json::array()) {
    SW_CHECK(id.is_number_integer(), "{}: eos_token_id {} is not a token id or a list of ids", file.string(), j.dump());
    ids.push_back(id.get<int64_t>());
  }
  if (ids.empty() && codec.tokenizer && codec.tokenizer->eos_id() >= 0) ids.push_back(codec.tokenizer->eos_id());
  return ids.empty() ? std::vector<int64_t>{-1} : ids;
}

// A LoRA checkpoint or PEFT adapter directory (adapter_config.json, no config.json) is not a model:
// the error names it and the `ckpt lora-merge` that makes one from it and its base.
void refuse_adapter_directory(const std::filesystem::path& dir) {
  if (!std::filesystem::exists(dir / "adapter_config.json") || std::filesystem::exists(dir / "config.json")) return;
  std::string base = "BASE";
  try {
    const nlohmann::json j = ckpt::load_json(dir, "adapter_config.json");
    if (j.value("base_model_name_or_path", nlohmann::json()).is_string()) base = j["base_model_name_or_path"];
  } catch (const std::exception&) {
  }
  // The merged model beside the run's checkpoints (<run>/merged-checkpoint-N), else beside DIR.
  const std::filesystem::path out =
      dir.parent_path().filename() == "checkpoints"
          ? dir.parent_path().parent_path() / ("merged-" + dir.filename().string())
          : std::filesystem::path(dir.string() + "-merged");
  fail("--checkpoint {} holds LoRA adapters (adapter_config.json), not a model: merge them into their base model "
       "first, `shardwise ckpt lora-merge {} {} {}`, then generate with --checkpoint {}", dir.string(),
       shell_quoted(base.empty() ? "BASE" : base), shell_quoted(dir.string()), shell_quoted(out.string()),
       shell_quoted(out.string()));
}

struct Run {
  train::GptConfig model;
  train::Strategy strategy;
  std::vector<std::vector<int64_t>> prompts;
  train::GenerateConfig config;
  std::filesystem::path dir;
  TextCodec codec;
  Device device;  // --device (cli/device_option.h)
};

void print_text(const Run& run, const train::GenerateResult& r, std::ostream& out) {
  const bool text = run.codec.has_text();
  for (size_t i = 0; i < r.sequences.size(); ++i) {
    const auto& s = r.sequences[i];
    std::span<const int64_t> shown(s.tokens);
    if (s.stop == train::StopReason::Eos) shown = shown.first(shown.size() - 1);  // the eos ends the line
    if (text) {
      // Decoded as one sequence: a SentencePiece piece's leading space survives at the seam.
      std::vector<int64_t> all = run.prompts[i];
      all.insert(all.end(), shown.begin(), shown.end());
      out << run.codec.decode(all) << "\n";
    } else {
      out << fmt::format("{} | {}\n", fmt::join(run.prompts[i], ","), fmt::join(shown, ","));
    }
  }
}

void print_json(const Run& run, const train::GenerateResult& r, const std::string& world, std::ostream& out) {
  nlohmann::json seqs = nlohmann::json::array();
  for (size_t i = 0; i < r.sequences.size(); ++i) {
    const auto& s = r.sequences[i];
    nlohmann::json j = {{"prompt_ids", run.prompts[i]}, {"new_ids", s.tokens}, {"stop", stop_reason_name(s.stop)}};
    if (run.codec.has_text()) j["prompt"] = run.codec.decode(run.prompts[i]), j["text"] = run.codec.decode(s.tokens);
    seqs.push_back(std::move(j));
  }
  const auto& st = r.stats;
  nlohmann::json j = {
      {"model", run.dir.string()},
      {"mesh", run.strategy.mesh.to_string()},
      {"device", run.device.to_string()},
      {"ranks", world},
      {"kv_cache", run.config.kv_cache},
      {"sequences", std::move(seqs)},
      {"stats",
       {{"new_tokens", st.new_tokens},
        {"decode_tokens", st.decode_tokens},
        {"steps", st.steps},
        {"plan_seconds", st.plan_seconds},
        {"prefill_seconds", st.prefill_seconds},
        {"decode_seconds", st.decode_seconds},
        {"tokens_per_second", st.tokens_per_second()},
        {"decode_tokens_per_second", st.decode_tokens_per_second()}}}};
  out << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
}

// --logits-out: each prompt's rows of logits, the distributions its new tokens came from.
void write_logits(const train::GenerateResult& r, int64_t vocab, const std::string& path) {
  std::vector<Tensor> rows;
  std::vector<ckpt::StEntry> entries;
  for (const train::GeneratedSequence& s : r.sequences) rows.push_back(train::logits_tensor(s, vocab));
  for (size_t i = 0; i < rows.size(); ++i) entries.push_back(ckpt::entry_of(fmt::format("logits.{}", i), rows[i]));
  ckpt::write_safetensors(path, entries, ckpt::StMetadata{{"format", "pt"}});
}

void generate_rank(const Run& run, const GenerateOptions& o, comm::Communicator& world_ref,
                   std::shared_ptr<comm::Communicator> world, std::ostream& out, train::GenerateResult* result) {
  RankThreads threads(o.kernel_threads);  // this rank's kernel threads (tensor/parallel.h)
  const int64_t process = world->members()[static_cast<size_t>(world->rank())];
  train::Generator gen(run.model, run.strategy, world,
                       train::checkpoint_weights(run.dir, run.model, process, run.strategy.pp >= 0), run.device);
  train::GenerateResult r = gen.generate(run.prompts, run.config);
  if (world_ref.rank() != 0) return;
  if (result) {  // the caller's, not printed
    *result = std::move(r);
    return;
  }
  if (!o.logits_out.empty()) write_logits(r, run.model.vocab, o.logits_out);
  const std::string ranks = fmt::format("{}, {}", counted(world_ref.size(), "rank"), world_ref.backend());
  if (o.json) {
    print_json(run, r, ranks, out);
  } else {
    print_text(run, r, out);
  }
  out.flush();
  for (size_t i = 0; i < r.sequences.size(); ++i) {
    if (r.sequences[i].stop == train::StopReason::MaxPositions)
      std::cerr << fmt::format("shardwise generate: prompt {} stopped at the model's {} positions ({}; the last "
                               "token is predicted from the last position)\n",
                               i, run.model.seq, positions_key(run.model));
  }
  const auto& st = r.stats;
  std::cerr << fmt::format("shardwise generate: {} for {} in {:.3g} s ({:.1f} tokens/s; decode "
                           "{:.1f} tokens/s; {}; planning {:.3g} s) on {} ({}{})\n",
                           counted(st.new_tokens, "new token"), counted(static_cast<int64_t>(r.sequences.size()), "prompt"),
                           st.prefill_seconds + st.decode_seconds,
                           st.tokens_per_second(), st.decode_tokens_per_second(),
                           run.config.kv_cache ? "KV cache" : "recomputing the prefix", st.plan_seconds,
                           run.strategy.to_string(), ranks,
                           run.device.is_host() ? "" : ", on " + device_label(o.device, run.device));
  if (!o.gemm_line.empty()) std::cerr << "  " << o.gemm_line << "\n";
}

}  // namespace

int cmd_generate(const GenerateOptions& options, std::ostream& out) { return run_generate(options, out, nullptr); }

int run_generate(const GenerateOptions& options, std::ostream& out, train::GenerateResult* result) {
  GenerateOptions o = options;
  SW_CHECK(!o.checkpoint.empty(), "give the model: --checkpoint DIR (or --init-from DIR), a checkpoint or model "
                                  "directory with config.json");
  Run run;
  run.dir = o.checkpoint;
  SW_CHECK(std::filesystem::is_directory(run.dir), "--checkpoint '{}' is not a directory (a checkpoint such as "
                                                   "<save-dir>/checkpoint-<step>, or a model directory)", o.checkpoint);
  refuse_adapter_directory(run.dir);
  run.model = train::read_model_config(run.dir);
  // Mistral: prompt and generated tokens within its sliding window, where full causal attention is its attention
  // (a window longer than max_position_embeddings bounds nothing: the positions stay the bound).
  if (run.model.sliding_window > 0) run.model.seq = std::min(run.model.seq, run.model.sliding_window);
  run.strategy = train::Strategy::from_mesh(mesh::parse_mesh(o.mesh), false);
  SW_CHECK(run.model.heads % run.strategy.tp_size() == 0,
           "the model's {} heads do not divide over tp={} (each tp rank needs whole heads)", run.model.heads,
           run.strategy.tp_size());
  const bool mpi = comm::launched_by_mpirun();
  const int64_t ranks = count_ranks(o.ranks, [&] { return run.strategy.mesh.size(); });
  SW_CHECK(run.strategy.mesh.size() == ranks, "mesh {} has {} ranks but {} ranks run (use --ranks {} or mpirun -np {})",
           run.strategy.mesh.to_string(), run.strategy.mesh.size(), ranks, run.strategy.mesh.size(),
           run.strategy.mesh.size());
  // A checkpoint of a --tokenizer run holds its tokenizer.model (train/run_options.h).
  if (o.tokenizer.empty()) o.tokenizer = train::stored_tokenizer(run.dir).value_or("");
  run.codec = codec_for(o, run.model);
  run.prompts = collect_prompts(o, run.model, run.codec);
  train::check_prompts(run.prompts, run.model);
  run.config.max_new_tokens = o.max_new_tokens;
  run.config.kv_cache = !o.no_kv_cache;
  run.config.keep_logits = !o.logits_out.empty() || o.keep_logits;
  if (run.codec.tokenizer) run.config.usable_vocab = run.codec.tokenizer->vocab_size();  // not the padding ids
  if (!o.logits_out.empty()) {  // before any work: the file is written after generating
    const std::filesystem::path parent = std::filesystem::absolute(o.logits_out).parent_path();
    SW_CHECK(std::filesystem::is_directory(parent) && ::access(parent.c_str(), W_OK) == 0,
             "--logits-out '{}': the directory '{}' does not exist or is not writable", o.logits_out, parent.string());
  }
  // Without --temperature: greedy, unless --top-k or --top-p ask for sampling (then temperature 1).
  const bool sampling = o.top_k > 0 || o.top_p < 1;
  run.config.sampling.temperature = o.temperature != kTemperatureUnset ? o.temperature : (sampling ? 1.0 : 0.0);
  run.config.sampling.top_k = o.top_k;
  run.config.sampling.top_p = o.top_p;
  run.config.sampling.seed = o.seed;
  SW_CHECK(o.eos_id >= kEosFromModel, "--eos-id must be a token id, or -1 for none, got {}", o.eos_id);
  const std::vector<int64_t> eos = resolve_eos(o, run.dir, run.codec);
  run.config.eos_id = eos.front();
  run.config.more_eos_ids.assign(eos.begin() + 1, eos.end());
  run.config.validate(run.model);
  run.device = use_device(o.device);  // registers it: before any work
  // Before any GEMM (fixes the library's core type); printed on stderr after the summary line.
  o.gemm_line = choose_gemm(o.gemm);
  set_blas_threads(mpi || ranks > 1 ? 1 : 0);
  // Each rank's kernels split their loops over as many threads as its GEMMs use (one per rank when
  // ranks share the machine, the GEMM library's count for one rank): the cores in use stay the same.
  o.kernel_threads = mpi || ranks > 1 ? 1 : blas_threads();
  if (mpi) {
    return comm::run_mpi_main([&](comm::Communicator& world) { generate_rank(run, o, world, comm::mpi_world(), out, result); });
  }
  comm::LocalWorld::run(static_cast<int>(ranks), [&](comm::Communicator& world) {
    generate_rank(run, o, world, world.group(world.members()), out, result);
  });
  return 0;
}

}  // namespace shardwise::cli
