#pragma once
// `shardwise train`'s (and `plan`'s) options in sections: model, parallel, optimizer, data,
// checkpoint and logging. A section is the option's group in `train --help` and the table of a
// --config file that may hold it (`[model]`, `[parallel]`, ...; the flat form and `[train]` hold
// any key). Options that name input files are typed PATH (one path), PATHS (a comma-separated
// list or globs) or "PATH|auto" (--resume), so a --config file resolves them from its own directory.
#include <CLI/CLI.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "shardwise/cli/commands.h"

namespace shardwise::cli {

// `shardwise train`'s options, bound to `options` (app.cc); group_train_options then sorts them into
// their sections.
void add_train_options(CLI::App& cmd, TrainOptions& options);

struct OptionSection {
  std::string_view key;    // the config file's table: "model" for [model]
  std::string_view title;  // the --help group's heading
  std::vector<std::string_view> options;  // long names, without "--"
};
// Every section and its options, in --help's order.
const std::vector<OptionSection>& train_option_sections();
// Puts every option of `cmd` that a section lists into that section's --help group (heading
// "<Title> [<key>]"), types the input-path options, and gives `cmd` a help formatter without
// CLI11's flag-value artefacts ("--no-prefetch{false}"). Options no section lists stay in the
// ungrouped "Options" heading (tests/cli checks there are none but --help and --config).
void group_train_options(CLI::App& cmd);

// `shardwise plan`'s options: train's (the run it plans, with train's defaults and sections),
// then its own: --memory, --check, --explain, --summary.
void add_plan_options(CLI::App& cmd, TrainOptions& run, PlanOptions& plan);

// What sets a run's options besides the command line, in order: the --config file, the resumed
// checkpoint's run_options.json (cli/train/stored_options.h), --init-from's config.json, the --lora-*
// options (apply_lora); and whether --vocab and --steps were set (cli/train/data_defaults.h). `lora_needs_base` false (`plan`, of the program or its memory):
// --lora-rank without --init-from plans the adapters on a freshly initialised base.
void apply_run_sources(CLI::App& cmd, TrainOptions& options, bool lora_needs_base = true);

}  // namespace shardwise::cli
