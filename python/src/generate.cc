// Generation from Python (shardwise.generate in python/shardwise/training.py): `shardwise generate`
// itself (cli::run_generate) with the result handed back instead of printed: each prompt's new token
// ids, its stop reason and, when asked, its logits as a NumPy array over a shardwise tensor.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <iostream>

#include "arrays.h"
#include "errors.h"
#include "shardwise/cli/commands.h"
#include "shardwise/generate/generate.h"
#include "shardwise/models/model_io.h"

namespace shardwise::py {
namespace {

nb::list generate(const std::string& checkpoint, const std::vector<std::string>& prompts,
                  const std::vector<std::vector<int64_t>>& prompt_ids, int64_t max_new_tokens,
                  std::optional<double> temperature, int64_t top_k, double top_p, uint64_t seed,
                  std::optional<int64_t> eos_id, const std::string& mesh, int64_t ranks, const std::string& tokenizer,
                  bool kv_cache, bool return_logits) {
  cli::GenerateOptions o;
  o.checkpoint = checkpoint;
  o.prompts = prompts;
  std::vector<std::string> seqs;
  for (const auto& ids : prompt_ids) seqs.push_back(fmt::format("{}", fmt::join(ids, ",")));
  o.prompt_ids = fmt::format("{}", fmt::join(seqs, ";"));
  o.max_new_tokens = max_new_tokens;
  o.temperature = temperature.value_or(cli::kTemperatureUnset);
  o.top_k = top_k;
  o.top_p = top_p;
  o.seed = seed;
  o.eos_id = eos_id.value_or(cli::kEosFromModel);
  o.mesh = mesh;
  o.ranks = ranks;
  o.tokenizer = tokenizer;
  o.no_kv_cache = !kv_cache;
  o.keep_logits = return_logits;
  train::GenerateResult result;
  {
    nb::gil_scoped_release release;
    raising(ErrorKind::Usage, [&] { cli::run_generate(o, std::cout, &result); });
  }
  const int64_t vocab = return_logits ? train::read_model_config(checkpoint).vocab : 0;
  nb::list out;
  for (const train::GeneratedSequence& s : result.sequences) {
    nb::object logits = return_logits ? array_from(train::logits_tensor(s, vocab)) : nb::none();
    out.append(nb::make_tuple(s.tokens, std::string(train::stop_reason_name(s.stop)), logits));
  }
  return out;
}

}  // namespace

void bind_generate(nb::module_& m) {
  m.def("_generate", &generate, nb::arg("checkpoint"), nb::arg("prompts"), nb::arg("prompt_ids"),
        nb::arg("max_new_tokens"), nb::arg("temperature").none(), nb::arg("top_k"), nb::arg("top_p"), nb::arg("seed"),
        nb::arg("eos_id").none(), nb::arg("mesh"), nb::arg("ranks"), nb::arg("tokenizer"), nb::arg("kv_cache"),
        nb::arg("return_logits"),
        "`shardwise generate`: per prompt (new token ids, stop reason, logits [new, vocab] or None).");
}

}  // namespace shardwise::py
