#include "shardwise/cli/usage.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "shardwise/core/error.h"

namespace shardwise::cli {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates, std::string_view prefix) {
  const size_t limit = std::max<size_t>(2, word.size() / 3);
  size_t best = limit + 1;
  std::string found;
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best) best = d, found = c;
  }
  return found.empty() ? "" : fmt::format(" (did you mean '{}{}'?)", prefix, found);
}

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// The line without its `#` comment (a `#` inside a quoted string stays).
std::string_view strip_comment(std::string_view line) {
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '"') quoted = !quoted;
    if (line[i] == '#' && !quoted) return line.substr(0, i);
  }
  return line;
}

std::vector<std::string> long_names(const CLI::App& cmd) {
  std::vector<std::string> names;
  for (const CLI::Option* opt : cmd.get_options()) {
    for (const auto& n : opt->get_lnames()) {
      if (n != "help" && n != "config" && n != "version") names.push_back(n);
    }
  }
  return names;
}

// The value's text for CLI11, checked against the option's type: strings in quotes, numbers and
// true/false without.
std::string config_value(const CLI::Option& opt, std::string_view value, const std::string& where,
                         const std::string& key) {
  const bool quoted = value.size() >= 2 && value.front() == '"' && value.back() == '"';
  SW_CHECK(quoted || value.find('"') == std::string_view::npos, "{}: key '{}': unbalanced quotes in {}", where, key,
           value);
  const std::string type = opt.get_type_name();
  if (opt.get_expected_max() == 0) {  // a flag
    SW_CHECK(!quoted && (value == "true" || value == "false"), "{}: key '{}' is a flag: expected true or false, got {}",
             where, key, value);
    return opt.get_flag_value(key, std::string(value));  // `no-prefetch = true` turns prefetch off
  }
  if (type.starts_with("TEXT") || type.starts_with("PATH")) {
    SW_CHECK(quoted, "{}: key '{}' expects a string in double quotes, got {}", where, key, value);
    return std::string(value.substr(1, value.size() - 2));
  }
  SW_CHECK(!quoted && value != "true" && value != "false", "{}: key '{}' expects {}, got {}", where, key,
           type.starts_with("FLOAT") ? "a number" : "an integer", value);
  if (type.starts_with("INT") || type.starts_with("UINT")) {  // `steps = 3.5` is not truncated to 3
    const std::string_view digits = value.substr(value.front() == '-' || value.front() == '+' ? 1 : 0);
    SW_CHECK(!digits.empty() && digits.find_first_not_of("0123456789") == std::string_view::npos,
             "{}: key '{}' expects an integer, got {}", where, key, value);
  }
  return std::string(value);
}

}  // namespace

std::string option_section(const CLI::Option& opt) {
  const std::string& group = opt.get_group();
  const size_t open = group.rfind('[');
  if (open == std::string::npos || group.back() != ']') return "";
  return group.substr(open + 1, group.size() - open - 2);
}

namespace {

// A value of a path-typed option (train_options.h) resolved from the config file's directory:
// absolute paths, "auto" of --resume and empty values stay; PATHS resolves each comma-separated part.
std::string resolve_from(const std::filesystem::path& dir, const std::string& type, const std::string& value) {
  if (type != "PATH" && type != "PATHS" && type != "PATH|auto") return value;
  if (value.empty() || (type == "PATH|auto" && value == "auto")) return value;
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    size_t comma = type == "PATHS" ? value.find(',', start) : std::string::npos;
    std::filesystem::path part = value.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    parts.push_back(part.is_absolute() || part.empty() ? part.string() : (dir / part).lexically_normal().string());
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return fmt::format("{}", fmt::join(parts, ","));
}

// Checks `text` the way the command line's value was checked (type, range, choices) without
// changing what the command line gave: the option parses `text`, then its own results again.
void check_like_command_line(CLI::Option& opt, const std::string& text) {
  const std::vector<std::string> given = opt.results();
  opt.clear();
  opt.add_result(text);
  std::string error;
  try {
    opt.run_callback();
  } catch (const CLI::Error& e) {
    error = e.what();
  }
  opt.clear();
  opt.add_result(given);
  opt.run_callback();
  SW_CHECK(error.empty(), "{}", error);
}

// The sections a config file of `cmd` may have: its options' groups' tables.
std::vector<std::string> sections_of(const CLI::App& cmd) {
  std::vector<std::string> sections;
  for (const CLI::Option* opt : cmd.get_options()) {
    std::string s = option_section(*opt);
    if (!s.empty() && std::find(sections.begin(), sections.end(), s) == sections.end()) sections.push_back(s);
  }
  return sections;
}

}  // namespace

void apply_config_file(CLI::App& cmd, const std::string& path) {
  SW_CHECK(!std::filesystem::is_directory(path), "--config '{}' is a directory; expected a TOML file", path);
  std::ifstream in(path);
  SW_CHECK(in.good(), "cannot read the config file '{}'", path);
  const std::filesystem::path dir = std::filesystem::absolute(path).parent_path();
  const std::vector<std::string> names = long_names(cmd);
  const std::vector<std::string> sections = sections_of(cmd);
  std::string section;  // "": the flat form or [<command>], which hold any key
  std::set<std::string> seen;
  std::string raw;
  for (int number = 1; std::getline(in, raw); ++number) {
    const std::string where = fmt::format("{} line {}", path, number);
    std::string_view line = trim(strip_comment(raw));
    if (line.empty()) continue;
    if (line.front() == '[') {
      const std::string name(trim(line.substr(1, line.size() - (line.back() == ']' ? 2 : 1))));
      const bool known = std::find(sections.begin(), sections.end(), name) != sections.end();
      SW_CHECK(line.back() == ']' && (name == cmd.get_name() || known), "{}: section {}: {}{}", where, line,
               sections.empty() ? fmt::format("only [{}] (or no section) is allowed", cmd.get_name())
                                : fmt::format("use [{}] (or [{}], or no section)", fmt::join(sections, "], ["),
                                              cmd.get_name()),
               did_you_mean(name, sections));
      section = known ? name : "";
      continue;
    }
    size_t eq = line.find('=');
    SW_CHECK(eq != std::string_view::npos, "{}: expected `key = value`, got '{}'", where, line);
    const std::string key(trim(line.substr(0, eq)));
    std::string_view value = trim(line.substr(eq + 1));
    SW_CHECK(std::find(names.begin(), names.end(), key) != names.end(), "{}: unknown key '{}'{}", where, key,
             did_you_mean(key, names));
    SW_CHECK(!value.empty(), "{}: key '{}' has no value", where, key);
    SW_CHECK(seen.insert(key).second, "{}: key '{}' is given twice", where, key);
    CLI::Option* opt = cmd.get_option("--" + key);
    const std::string belongs = option_section(*opt);
    SW_CHECK(section.empty() || belongs == section, "{}: key '{}' belongs in [{}], not [{}]", where, key,
             belongs.empty() ? cmd.get_name() : belongs, section);
    const std::string text = resolve_from(dir, opt->get_type_name(), config_value(*opt, value, where, key));
    try {
      if (opt->count() > 0) {  // the command line wins, but the file's value must be one it could give
        check_like_command_line(*opt, text);
        continue;
      }
      opt->add_result(text);
      opt->run_callback();
    } catch (const CLI::Error& e) {
      fail("{}: key '{}': {}", where, key, e.what());
    } catch (const Error& e) {
      fail("{}: key '{}': {}", where, key, e.what());
    }
  }
}

namespace {

bool is_number(std::string_view s) {
  double v = 0;
  auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

// The chosen commands from the top: app, then each parsed subcommand.
std::vector<CLI::App*> chosen_chain(CLI::App& app) {
  std::vector<CLI::App*> chain{&app};
  while (!chain.back()->get_subcommands().empty()) chain.push_back(chain.back()->get_subcommands().front());
  return chain;
}

std::string command_name(const std::vector<CLI::App*>& chain) {
  std::string name = "shardwise";
  for (size_t i = 1; i < chain.size(); ++i) name += " " + chain[i]->get_name();
  return name;
}

// The first option in argv that no command of the chain knows, as an error line; "" if none.
std::string unknown_option(const std::vector<CLI::App*>& chain, int argc, char** argv) {
  std::set<std::string> known;
  for (const CLI::App* a : chain) {
    for (const CLI::Option* opt : a->get_options()) {
      for (const auto& n : opt->get_lnames()) known.insert("--" + n);
      for (const auto& n : opt->get_snames()) known.insert("-" + n);
    }
  }
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-' || is_number(arg)) continue;
    std::string name(arg.substr(0, arg.find('=')));
    if (known.count(name)) continue;
    std::vector<std::string> longs = long_names(*chain.back());
    return fmt::format("unknown option '{}' for `{}`{}", name, command_name(chain),
                       did_you_mean(name.substr(name.find_first_not_of('-')), longs, "--"));
  }
  return "";
}

// The first word of argv that is not an option, an option's value or a chosen command; "" if none.
std::string first_stray_word(const std::vector<CLI::App*>& chain, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg.starts_with("-")) {
      ++i;  // skip the option's value (a stray word never follows an option here)
      continue;
    }
    bool command = std::any_of(chain.begin() + 1, chain.end(), [&](CLI::App* a) { return a->get_name() == arg; });
    if (!command) return std::string(arg);
  }
  return "";
}

}  // namespace

void refuse_out_of_range_integers(CLI::App& app) {
  auto fits = [](auto zero) {
    return CLI::Validator(
        [zero](std::string& text) -> std::string {
          auto value = zero;
          bool out_of_range =
              std::from_chars(text.data(), text.data() + text.size(), value).ec == std::errc::result_out_of_range;
          return out_of_range ? fmt::format("{} does not fit in a 64-bit integer", text) : "";
        },
        "", "64-bit");
  };
  for (CLI::Option* opt : app.get_options()) {
    std::string type = opt->get_type_name();
    if (type.starts_with("INT")) opt->check(fits(int64_t{0}));
    if (type.starts_with("UINT")) opt->check(fits(uint64_t{0}));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) refuse_out_of_range_integers(*sub);
}

bool reports_errors() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}) {
    if (const char* rank = std::getenv(name); rank && *rank) return std::atoi(rank) == 0;
  }
  return true;
}

int usage_error_status() {
  if (!reports_errors()) std::this_thread::sleep_for(std::chrono::seconds(5));
  return 2;
}

int report_parse_error(CLI::App& app, const CLI::ParseError& e, int argc, char** argv, std::ostream& err) {
  if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);  // --help, --version
  const std::vector<CLI::App*> chain = chosen_chain(app);
  const std::string name = command_name(chain);
  std::vector<std::string> commands;
  for (const CLI::App* sub : chain.back()->get_subcommands([](CLI::App*) { return true; })) commands.push_back(sub->get_name());
  const bool extras = dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr;
  const bool needs_command = dynamic_cast<const CLI::RequiredError*>(&e) && !commands.empty();
  std::string line;
  if (extras || needs_command) line = unknown_option(chain, argc, argv);
  if (line.empty() && (extras || needs_command)) {
    std::string word = first_stray_word(chain, argc, argv);
    std::string list = fmt::format("{}", fmt::join(commands, ", "));
    if (!commands.empty() && !word.empty())
      line = fmt::format("unknown command '{}' for `{}`{}; commands: {}", word, name, did_you_mean(word, commands), list);
    else if (!commands.empty())
      line = fmt::format("`{}` needs a command: {}", name, list);
    else if (!word.empty())
      line = fmt::format("unexpected argument '{}' for `{}`", word, name);
  }
  if (line.empty()) {
    line = e.what();
    std::replace(line.begin(), line.end(), '\n', ' ');
  }
  // One write: under mpirun a line written in pieces can come out with mpirun's own notice inside it.
  err << fmt::format("shardwise: error: {} (see `{} --help`)\n", line, name) << std::flush;
  return usage_error_status();
}

}  // namespace shardwise::cli
