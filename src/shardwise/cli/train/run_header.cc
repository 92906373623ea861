#include "shardwise/cli/train/run_header.h"

#include <fmt/format.h>

#include <string_view>
#include <vector>

namespace shardwise::cli {

std::string shell_quoted(const std::string& arg) {
  bool plain = !arg.empty();
  for (char c : arg) {
    plain = plain && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      std::string_view("-_./=:,+@%").find(c) != std::string_view::npos);
  }
  if (plain) return arg;
  std::string q = "'";
  for (char c : arg) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string given_options(const CLI::App& cmd) {
  std::vector<std::string> given;
  for (const CLI::Option* opt : cmd.get_options()) {
    if (opt->count() == 0 || opt->get_lnames().empty()) continue;
    if (opt->get_expected_max() == 0) {  // a flag: the name whose flag value is the value it has
      const std::string value = opt->as<bool>() ? "true" : "false";
      for (const std::string& name : opt->get_lnames()) {
        if (opt->get_flag_value(name, "") == value) given.push_back("--" + name);
      }
      continue;
    }
    const std::string value = fmt::format("{}", fmt::join(opt->results(), ","));
    if (value == opt->get_default_str() || "[" + value + "]" == opt->get_default_str()) continue;
    given.push_back("--" + opt->get_lnames().front() + " " + shell_quoted(value));
  }
  return fmt::format("{}", fmt::join(given, " "));
}

std::string count_text(int64_t n) {
  std::string digits = std::to_string(n), grouped;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) grouped += ',';
    grouped += digits[i];
  }
  const double x = static_cast<double>(n);
  if (x >= 1e9) return fmt::format("{} ({:.2f} B)", grouped, x / 1e9);
  if (x >= 1e6) return fmt::format("{} ({:.2f} M)", grouped, x / 1e6);
  if (x >= 1e3) return fmt::format("{} ({:.1f} K)", grouped, x / 1e3);
  return grouped;
}

}  // namespace shardwise::cli
