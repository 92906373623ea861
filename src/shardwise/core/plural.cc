#include "shardwise/core/plural.h"

#include <fmt/format.h>

namespace shardwise {

std::string plural_noun(int64_t n, std::string_view one, std::string_view many) {
  if (n == 1 || n == -1) return std::string(one);
  if (!many.empty()) return std::string(many);
  const bool es = one.ends_with('s') || one.ends_with('x') || one.ends_with("ch") || one.ends_with("sh");
  return std::string(one) + (es ? "es" : "s");
}

std::string counted(int64_t n, std::string_view one, std::string_view many) {
  return fmt::format("{} {}", n, plural_noun(n, one, many));
}

}  // namespace shardwise
