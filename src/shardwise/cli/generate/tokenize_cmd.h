#pragma once
// `shardwise tokenize`: text to a token file through a SentencePiece model (`--tokenizer F --in
// text --out tokens.bin`), a token file back to text (`--decode`), or a small SentencePiece model
// trained on text (`--train-model`, the tests' fixture generator). Registered on the app by one
// call, run by another, so app.cc holds two lines for it.
#include <CLI/CLI.hpp>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

namespace shardwise::cli {

struct TokenizeCommand {
  CLI::App* cmd = nullptr;
  std::string tokenizer, output, format = "auto", documents = "file", separator;
  std::vector<std::string> inputs;
  bool eos = true, decode = false, train_model = false;
  int64_t vocab_size = 512;
  std::string model_prefix, model_type = "bpe";
  bool chosen() const { return cmd && *cmd; }
  int run(std::ostream& out) const;
};

std::unique_ptr<TokenizeCommand> add_tokenize_command(CLI::App& app);

}  // namespace shardwise::cli
