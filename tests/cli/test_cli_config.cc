// `shardwise train`'s options in sections (cli/train/train_options.h): the --help groups and the tables
// of a --config file are the same sections; a key in another section is refused naming its own;
// every option is a config key; a file's value is checked even where the command line wins;
// input paths in a file resolve from the file's directory (examples/llama_tiny.toml runs alone).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "run_cli.h"
#include "shardwise/cli/train/train_options.h"
#include "shardwise/cli/usage.h"
#include "shardwise/core/error.h"

namespace {

namespace fs = std::filesystem;
using shardwise_cli_test::lines;
using shardwise_cli_test::Result;
using shardwise_cli_test::run;
using shardwise_cli_test::tmp;

const std::string kSmall = "--layers 1 --hidden 32 --global-batch 16 --eval-every 0 --progress lines";

std::string write_config(const std::string& name, const std::string& text) {
  const std::string path = tmp(name);
  std::ofstream(path) << text;
  return path;
}

TEST(CliConfig, HelpGroupsTheOptionsBySectionWithoutFlagArtefacts) {
  Result help = run("train --help");
  ASSERT_EQ(help.status, 0) << help.out;
  size_t at = 0;
  for (const char* heading : {"Model [model]:", "Parallelism [parallel]:", "Optimizer [optimizer]:", "Data [data]:",
                              "Checkpoints [checkpoint]:", "Logging [logging]:"}) {
    const size_t found = help.out.find(std::string("\n") + heading + "\n");
    ASSERT_NE(found, std::string::npos) << heading << "\n" << help.out;
    EXPECT_GT(found, at) << heading << " out of order";
    at = found;
  }
  // Options in their sections: --lr under Optimizer, --bf16 under Model, --no-prefetch under Data.
  EXPECT_GT(help.out.find("  --lr "), help.out.find("Optimizer [optimizer]:"));
  EXPECT_LT(help.out.find("  --bf16 "), help.out.find("Parallelism [parallel]:"));
  EXPECT_NE(help.out.find("  --no-prefetch "), std::string::npos) << help.out;
  EXPECT_EQ(help.out.find("{false}"), std::string::npos) << help.out;
  EXPECT_EQ(help.out.find("{true}"), std::string::npos) << help.out;
  // Nothing but --help and --config left outside a section.
  const std::string ungrouped = help.out.substr(help.out.find("Options:"), help.out.find("Model [model]:") -
                                                                              help.out.find("Options:"));
  EXPECT_EQ(lines(ungrouped), 4) << ungrouped;
}

TEST(CliConfig, EveryOptionIsAConfigKeyInItsSection) {
  CLI::App app{"shardwise"};
  shardwise::cli::TrainOptions o;
  CLI::App* cmd = app.add_subcommand("train");
  cmd->option_defaults()->always_capture_default();
  shardwise::cli::add_train_options(*cmd, o);
  shardwise::cli::group_train_options(*cmd);
  // Each option's default as a key in its own section: the file is read without an error and
  // changes nothing (a negated flag such as no-prefetch reads its own value, not its opposite).
  std::string text;
  for (const shardwise::cli::OptionSection& s : shardwise::cli::train_option_sections()) {
    text += "[" + std::string(s.key) + "]\n";
    for (std::string_view name : s.options) {
      const CLI::Option* opt = cmd->get_option("--" + std::string(name));
      ASSERT_EQ(shardwise::cli::option_section(*opt), s.key) << name;
      std::string value = opt->get_default_str();
      const std::string type = opt->get_type_name();
      if (value.starts_with("[")) value = type.starts_with("INT") ? "0" : "\"c_attn\"";  // lists: one element
      else if (type.starts_with("TEXT") || type.starts_with("PATH")) value = "\"" + value + "\"";
      if (opt->get_expected_max() == 0 && value.empty()) value = name == "tied-head" ? "true" : "false";  // flags
      text += std::string(name) + " = " + value + "\n";
    }
  }
  int sectioned = 0;
  for (const CLI::Option* opt : cmd->get_options()) {
    if (!shardwise::cli::option_section(*opt).empty()) ++sectioned;
    else EXPECT_TRUE(opt->check_lname("help") || opt->check_lname("config")) << opt->get_name() << " has no section";
  }
  EXPECT_GT(sectioned, 80);
  const std::string path = write_config("every_key.toml", text);
  ASSERT_NO_THROW(shardwise::cli::apply_config_file(*cmd, path)) << text;
  EXPECT_TRUE(o.config.data.loader_prefetch);
  EXPECT_TRUE(o.config.model.tie_word_embeddings);
  EXPECT_EQ(o.config.optimizer.steps, 4500);
}

TEST(CliConfig, SectionedFilesRunAndAKeyInAnotherSectionNamesItsOwn) {
  const std::string cfg = write_config(
      "sections.toml", "[model]\nlayers = 1\nhidden = 32\n[parallel]\nmesh = \"dp=2\"\n[optimizer]\nsteps = 2\n"
                       "lr = 0.003\n[data]\nno-prefetch = true\n[logging]\nrun-dir = \"" + tmp("sw-cfg-sections") + "\"\n");
  Result r = run("train --config " + cfg + " " + kSmall);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("done: 2 steps"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lr 0.003"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("; no prefetch)"), std::string::npos) << r.out;  // `no-prefetch = true` turns it off
  struct Bad {
    std::string name, text, message;
  };
  for (const Bad& b : std::vector<Bad>{
           {"wrong.toml", "[model]\nlayers = 1\nlr = 0.1\n", "line 3: key 'lr' belongs in [optimizer], not [model]"},
           {"typo.toml", "[modle]\n", "line 1: section [modle]: use ["},
           // The command line's --steps wins, but the file's value is still one --steps could take.
           {"float.toml", "[optimizer]\nsteps = 3.5\n", "line 2: key 'steps' expects an integer, got 3.5"},
           {"choice.toml", "data-format = \"nope\"\n", "line 1: key 'data-format': "},
       }) {
    Result bad = run("train --steps 1 " + kSmall + " --data-format auto --run-dir " + tmp("sw-cfg-bad") + " --config " +
                     write_config(b.name, b.text));
    EXPECT_EQ(bad.status, 2) << b.name << "\n" << bad.out;
    EXPECT_EQ(lines(bad.out), 1) << bad.out;
    EXPECT_NE(bad.out.find(b.message), std::string::npos) << b.name << "\n" << bad.out;
  }
  Result typo = run("train --config " + tmp("typo.toml"));
  EXPECT_NE(typo.out.find("(did you mean 'model'?)"), std::string::npos) << typo.out;
}

// examples/llama_tiny.toml from another directory: its data and tokenizer resolve from the file.
TEST(CliConfig, RelativePathsResolveFromTheConfigFile) {
  const fs::path dir = tmp("sw-cfg-elsewhere");
  fs::remove_all(dir);
  fs::create_directories(dir);
  Result r = shardwise_cli_test::run_command(
      "cd " + dir.string() + " && " + std::getenv("SHARDWISE_BIN") + " train --config " + SHARDWISE_SOURCE_DIR +
      "/examples/llama_tiny.toml --steps 2 --save-every 0 --progress none --run-dir " + (dir / "run").string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("data: " + fs::path(SHARDWISE_SOURCE_DIR "/tests/data/fables.txt").lexically_normal().string() +
                       " (text tokenized by " + SHARDWISE_SOURCE_DIR + "/examples/fables_512.model"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("done: 2 steps"), std::string::npos) << r.out;
  // An absolute path stays; a relative one on the command line is the current directory's.
  const std::string cfg = write_config("abs.toml", "[data]\ndata = \"/nonexistent/corpus.txt\"\n");
  Result abs = run("train --config " + cfg + " --steps 1");
  EXPECT_NE(abs.out.find("/nonexistent/corpus.txt"), std::string::npos) << abs.out;
  fs::remove_all(dir);
}

}  // namespace
