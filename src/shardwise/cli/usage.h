#pragma once
// What `shardwise` does with input it cannot use before any command runs: a `--config` file read
// onto a subcommand's options, and CLI11's parse errors turned into one `shardwise: error:` line
// with a "did you mean" suggestion (exit status 2).
#include <CLI/CLI.hpp>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace shardwise::cli {

// Levenshtein distance (insertions, deletions, substitutions).
size_t edit_distance(std::string_view a, std::string_view b);
// " (did you mean 'x'?)" for the nearest candidate within a third of the word's length (at least
// 2 edits), else "".
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates,
                         std::string_view prefix = "");

// Reads `path` — `key = value` lines, `#` comments, sections; values are "strings", integers,
// floats and true/false — and gives each key to the option of `cmd` with that long name, unless the
// command line gave that option (the command line wins; the file's value is still checked). A
// section is `[<command>]` (`[train]`, `[generate]`: any key, as without a section) or one of the
// tables of `cmd`'s option groups (train_options.h: `[model]`, `[parallel]`, ...), which holds only
// its own options. Values of PATH, PATHS and "PATH|auto" options resolve from the file's directory.
// Error naming the file, the line and the key for a missing file, an unknown key, a key in another
// section than its own (naming that one), a wrong type or value, or a bad line.
void apply_config_file(CLI::App& cmd, const std::string& path);
// The config-file table of `option`: the "[key]" that ends its --help group, or "" for none.
std::string option_section(const CLI::Option& option);

// Gives every integer option of `app` and its subcommands a check that refuses a number that does
// not fit in 64 bits (CLI11 would clamp it silently).
void refuse_out_of_range_integers(CLI::App& app);

// Prints CLI11's parse error `e` as one line "shardwise: error: ..." on `err` and returns 2;
// --help and --version print as CLI11 does and return 0.
int report_parse_error(CLI::App& app, const CLI::ParseError& e, int argc, char** argv, std::ostream& err);

// Whether this process says what went wrong before a command runs: every process not started by
// mpirun, and under mpirun the first of the job only (decided from the launcher's rank variables,
// OMPI_COMM_WORLD_RANK, PMIX_RANK or PMI_RANK, before MPI starts), so that a usage error of an
// mpirun job is printed once, not once per process. The exit status is the same on every process.
bool reports_errors();

// The exit status of a usage error, 2. A process that does not report it (reports_errors()) first
// waits up to 5 s: mpirun stops a job's other processes when one exits non-zero, which could stop
// the first process before it has said what went wrong; the first exits at once, and mpirun then
// ends the waiting ones.
int usage_error_status();

}  // namespace shardwise::cli
