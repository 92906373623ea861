#pragma once
// CLI11's help text without its artefacts, for every command: a flag's names without the values
// CLI11 appends to them ("--no-eos-between-documents{false}" reads "--no-eos-between-documents"),
// and a choice as its values ("gpt2|llama=gpt2", not "TEXT:{gpt2,llama}=gpt2").
#include <CLI/CLI.hpp>
#include <string>

namespace shardwise::cli {

class CleanHelpFormatter : public CLI::Formatter {
 public:
  std::string make_option_name(const CLI::Option* opt, bool positional) const override;
  std::string make_option_opts(const CLI::Option* opt) const override;
};

}  // namespace shardwise::cli
