#include "shardwise/cli/help_format.h"

#include <regex>

namespace shardwise::cli {

std::string CleanHelpFormatter::make_option_name(const CLI::Option* opt, bool positional) const {
  return std::regex_replace(CLI::Formatter::make_option_name(opt, positional), std::regex("\\{[^}]*\\}"), "");
}

std::string CleanHelpFormatter::make_option_opts(const CLI::Option* opt) const {
  std::string text = CLI::Formatter::make_option_opts(opt);
  static const std::regex choice("[A-Z]+:\\{([^}]*)\\}");
  std::smatch m;
  while (std::regex_search(text, m, choice)) {
    std::string values = m[1].str();
    for (char& c : values) c = c == ',' ? '|' : c;
    text.replace(static_cast<size_t>(m.position(0)), static_cast<size_t>(m.length(0)), values);
  }
  return text;
}

}  // namespace shardwise::cli
