#pragma once
// What the run header says beyond the model and the mesh: every option given (on the command line
// or in the --config file) that differs from its default, and counts of parameters.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace shardwise::cli {

// "--mesh dp=2 --bf16 --recompute full ...": each option of `cmd` that the command line or a config
// file set to another value than its default, as it would be typed (a flag by the name that gives
// its value: --untied-head, --no-prefetch); "" when none.
std::string given_options(const CLI::App& cmd);

// `arg` as a POSIX shell reads it back: as it is when it holds only letters, digits and -_./=:,+@%,
// else single-quoted (a ' inside as '\'').
std::string shell_quoted(const std::string& arg);

// "1,234,567 (1.23 M)".
std::string count_text(int64_t n);

}  // namespace shardwise::cli
