#pragma once
// `shardwise ckpt inspect|verify|merge|lora-merge|convert`: registered on the app by one call,
// run by another, so app.cc holds two lines for the whole family.
#include <CLI/CLI.hpp>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

namespace shardwise::cli {

struct CkptCommands {
  CLI::App* ckpt = nullptr;
  CLI::App *inspect = nullptr, *verify = nullptr, *merge = nullptr, *lora = nullptr, *convert = nullptr;
  std::string path, out, adapter, dtype, max_shard = "5GB";
  std::vector<std::string> remove_keys;
  double alpha = 0;
  int64_t rank = 0;
  bool no_checksums = false;
  bool skip_base_check = false;  // lora-merge: merge into a base other than the adapter's recorded one
  bool chosen() const { return ckpt && *ckpt; }
  int run(std::ostream& out) const;
};

std::unique_ptr<CkptCommands> add_ckpt_commands(CLI::App& app);

// "5GB" (10^9), "500MiB" (2^20), "1000" (bytes); Error otherwise.
uint64_t parse_byte_size(const std::string& text);

}  // namespace shardwise::cli
